package deploytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// zooKeeperJar is where Debian's zookeeper package installs the server; its
// manifest's Class-Path names the other jars it needs.
const zooKeeperJar = "/usr/share/java/zookeeper.jar"

// clickHouseServer is where Debian's clickhouse-server package installs the server.
const clickHouseServer = "/usr/sbin/clickhouse-server"

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	p, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// process is a server started by a test; stop ends it (SIGTERM, then SIGKILL).
type process struct {
	name string
	cmd  *exec.Cmd
	log  *bytes.Buffer
	done chan struct{} // closed when the process has exited; then err is its Wait error
	err  error
}

// startProcess runs cmd with its output kept for failure messages, killed by
// the kernel if the test binary dies, and stopped when the test ends.
func startProcess(t testing.TB, name string, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{name: name, cmd: cmd, log: new(bytes.Buffer), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// A process group of its own, so the stop reaches any child it forks;
	// and Wait returns even if such a child still holds the output pipe.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

// waitUntil polls ready every 100 ms until it returns nil, failing the test
// when the process exits or timeout passes.
func (p *process) waitUntil(t testing.TB, timeout time.Duration, ready func() error, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before it was ready: %v\n%s%s", p.name, p.err, p.log, logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %s: %v\n%s%s", p.name, timeout, err, p.log, logs())
		}
		time.Sleep(100 * time.Millisecond) // polling interval: ready is the condition
	}
}

// startZooKeeper runs Debian's ZooKeeper as a plain standalone server on
// loopback with a data folder of its own and returns its client port.
func startZooKeeper(t testing.TB) int {
	t.Helper()
	if _, err := os.Stat(zooKeeperJar); err != nil {
		t.Fatalf("ZooKeeper not installed (%v): install Debian's zookeeper package "+
			"(apt-get install -y --no-install-recommends zookeeper), or run scripts/test", err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java not found on PATH (Debian's zookeeper package depends on a JRE): %v", err)
	}
	dir := t.TempDir()
	port := freeLoopbackPort(t)
	cfg := fmt.Sprintf("tickTime=2000\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"+
		"admin.enableServer=false\n4lw.commands.whitelist=srvr\n", filepath.Join(dir, "data"), port)
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, "zookeeper", exec.Command(java, "-Xmx256m", "-XX:+UseSerialGC", "-cp", zooKeeperJar,
		"org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath))
	p.waitUntil(t, 60*time.Second, func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		// srvr answers "Mode: standalone" once the server serves clients
		// (before that: "not currently serving requests").
		if _, err := c.Write([]byte("srvr")); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("Mode: standalone")) {
			return fmt.Errorf("srvr answered %q", b)
		}
		return nil
	}, func() string { return "" })
	return port
}

// chNode is one ClickHouse server of the test cluster.
type chNode struct {
	name                string // replica name, the {replica} macro
	shard               string // the {shard} macro
	tcp, http, intersrv int
	dir                 string
	conn                driver.Conn // opened once the server answers
}

// addr is the node's native-protocol address.
func (n *chNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.tcp) }

// dsn is a DSN for database db on this node, with extra settings appended.
func (n *chNode) dsn(db string, settings ...string) string {
	s := "clickhouse://" + n.addr() + "/" + db
	if len(settings) > 0 {
		s += "?" + strings.Join(settings, "&")
	}
	return s
}

// chCluster is a ClickHouse cluster of plain child processes on loopback,
// sharing one ZooKeeper: shards x replicas servers, cluster name clusterName,
// each with the {cluster}, {shard} and {replica} macros set.
type chCluster struct {
	name   string
	shards [][]*chNode
}

// nodes lists every server, shard by shard.
func (c *chCluster) nodes() []*chNode {
	var out []*chNode
	for _, s := range c.shards {
		out = append(out, s...)
	}
	return out
}

// startClickHouseCluster starts shards x replicas ClickHouse servers that use
// the ZooKeeper at zkPort and know each other as cluster name.
func startClickHouseCluster(t testing.TB, name string, zkPort, shards, replicas int) *chCluster {
	t.Helper()
	bin := clickHouseServer
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("clickhouse-server")
		if lerr != nil {
			t.Fatalf("clickhouse-server not found at %s nor on PATH: install Debian's clickhouse-server package "+
				"(apt-get install -y --no-install-recommends clickhouse-server), or run scripts/test", bin)
		}
		bin = p
	}
	c := &chCluster{name: name}
	for s := 0; s < shards; s++ {
		var shard []*chNode
		for r := 0; r < replicas; r++ {
			shard = append(shard, &chNode{
				name:     fmt.Sprintf("s%dr%d", s+1, r+1),
				shard:    fmt.Sprintf("%02d", s+1),
				tcp:      freeLoopbackPort(t),
				http:     freeLoopbackPort(t),
				intersrv: freeLoopbackPort(t),
				dir:      t.TempDir(),
			})
		}
		c.shards = append(c.shards, shard)
	}
	var remote strings.Builder
	fmt.Fprintf(&remote, "<%s>\n", name)
	for _, shard := range c.shards {
		remote.WriteString("<shard><internal_replication>true</internal_replication>\n")
		for _, n := range shard {
			fmt.Fprintf(&remote, "<replica><host>127.0.0.1</host><port>%d</port></replica>\n", n.tcp)
		}
		remote.WriteString("</shard>\n")
	}
	fmt.Fprintf(&remote, "</%s>\n", name)

	var procs []*process
	for _, n := range c.nodes() {
		err := testenv.WriteClickHouseConfig(n.dir, testenv.ClickHouseConfig{TCPPort: n.tcp, HTTPPort: n.http,
			ServerXML: fmt.Sprintf(`    <interserver_http_port>%d</interserver_http_port>
    <interserver_http_host>127.0.0.1</interserver_http_host>
    <zookeeper><node><host>127.0.0.1</host><port>%d</port></node><session_timeout_ms>30000</session_timeout_ms></zookeeper>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
    <remote_servers>%s</remote_servers>
    <macros><cluster>%s</cluster><shard>%s</shard><replica>%s</replica></macros>`, n.intersrv, zkPort, remote.String(), name, n.shard, n.name),
			// The settings deploy/clickhouse/cluster.sql asks for in rollgate's profile.
			ProfileXML: `<insert_distributed_sync>1</insert_distributed_sync><load_balancing>in_order</load_balancing>`,
		})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--config-file="+filepath.Join(n.dir, "config.xml"))
		cmd.Dir = n.dir
		procs = append(procs, startProcess(t, "clickhouse "+n.name, cmd))
	}
	for i, n := range c.nodes() {
		n := n
		procs[i].waitUntil(t, 90*time.Second, func() error { return pingClickHouse(n.addr()) }, func() string {
			b, _ := os.ReadFile(filepath.Join(n.dir, "log", "server.err.log"))
			return string(b)
		})
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{n.addr()}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("connect %s: %v", n.name, err)
		}
		t.Cleanup(func() { conn.Close() })
		n.conn = conn
	}
	return c
}

func pingClickHouse(addr string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return conn.Ping(ctx)
}

// connect returns the connection to the node's default database, open for
// as long as the cluster runs.
func (n *chNode) connect(t testing.TB) driver.Conn {
	t.Helper()
	if n.conn == nil {
		t.Fatalf("%s is not started", n.name)
	}
	return n.conn
}
