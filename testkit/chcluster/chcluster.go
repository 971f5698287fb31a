// Package chcluster starts a ClickHouse cluster for tests: Debian's
// ZooKeeper as a standalone server and shards × replicas ClickHouse servers
// as plain child processes that share it, each on loopback (ports of its
// own) or on a host of its own (a listen address and a command wrapper, such
// as a testkit/netns host's Host.Command; fixed ports there). Every process
// is killed if the test binary dies and stopped when the test ends.
//
// The servers are configured by testenv.WriteClickHouseConfig (small
// caches, warnings-only logs); Statements turns deploy/clickhouse/cluster.sql
// into the statements a test applies with Node.Exec.
package chcluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// ZooKeeperJar is where Debian's zookeeper package installs the server; its
// manifest's Class-Path names the other jars it needs.
const ZooKeeperJar = "/usr/share/java/zookeeper.jar"

// ServerBinary is where Debian's clickhouse-server package installs the
// server (else it is looked up on PATH).
const ServerBinary = "/usr/sbin/clickhouse-server"

// Placement is where a server runs: the zero value is loopback with free
// ports and exec.Command.
type Placement struct {
	// Listen is the address the server listens on; set, the server uses
	// its default ports (ZooKeeper 2181; ClickHouse 9000, 8123, 9009), the
	// address being a host of its own.
	Listen string
	// Command makes the server's command (default exec.Command).
	Command func(name string, args ...string) *exec.Cmd
}

func (p Placement) host() string {
	if p.Listen == "" {
		return "127.0.0.1"
	}
	return p.Listen
}

func (p Placement) port(t testing.TB, fixed int) int {
	t.Helper()
	if p.Listen != "" {
		return fixed
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func (p Placement) command(name string, args ...string) *exec.Cmd {
	if p.Command == nil {
		return exec.Command(name, args...)
	}
	return p.Command(name, args...)
}

// Process is a server started by a test; it is stopped (SIGTERM, then
// SIGKILL after 15 s) when the test ends.
type Process struct {
	name string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{} // closed when the process has exited; then err is its Wait error
	err  error
}

// StartProcess runs cmd with its output kept for failure messages, in a
// process group of its own, killed by the kernel if the test binary dies,
// and stopped when the test ends.
func StartProcess(t testing.TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{name: name, cmd: cmd, log: &syncBuffer{}, done: make(chan struct{})}
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

// Kill kills the process group (SIGKILL) and waits for the process to exit.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Log is what the process wrote to its standard output and error.
func (p *Process) Log() string { return p.log.String() }

// WaitUntil polls ready every 100 ms until it returns nil, failing the test
// when the process exits or timeout passes (with its output and logs()).
func (p *Process) WaitUntil(t testing.TB, timeout time.Duration, ready func() error, logs func() string) {
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

// StartZooKeeper runs Debian's ZooKeeper as a standalone server with a data
// folder of its own where at places it and returns its client address
// (host:port) once it serves clients.
func StartZooKeeper(t testing.TB, at Placement) string {
	t.Helper()
	if _, err := os.Stat(ZooKeeperJar); err != nil {
		t.Fatalf("ZooKeeper not installed (%v): install Debian's zookeeper package "+
			"(apt-get install -y --no-install-recommends zookeeper), or run scripts/test", err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java not found on PATH (Debian's zookeeper package depends on a JRE): %v", err)
	}
	dir := t.TempDir()
	port := at.port(t, 2181)
	cfg := fmt.Sprintf("tickTime=2000\ndataDir=%s\nclientPort=%d\nclientPortAddress=%s\n"+
		"admin.enableServer=false\n4lw.commands.whitelist=srvr\n", filepath.Join(dir, "data"), port, at.host())
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(at.host(), strconv.Itoa(port))
	p := StartProcess(t, "zookeeper", at.command(java, "-Xmx256m", "-XX:+UseSerialGC", "-cp", ZooKeeperJar,
		"org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath))
	p.WaitUntil(t, 60*time.Second, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
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
	return addr
}

// Node is one ClickHouse server of a Cluster.
type Node struct {
	Name                   string // replica name, the {replica} macro
	Shard                  string // the {shard} macro
	Host                   string // its address
	TCP, HTTP, Interserver int
	Dir                    string
	at                     Placement
	bin                    string
	mu                     sync.Mutex
	proc                   *Process
	conn                   driver.Conn // opened once the server answers
	cluster                *Cluster    // for Exec's failure message
}

// Addr is the node's native-protocol address.
func (n *Node) Addr() string { return net.JoinHostPort(n.Host, strconv.Itoa(n.TCP)) }

// DSN is a DSN for database db on this node, with extra settings appended.
func (n *Node) DSN(db string, settings ...string) string {
	s := "clickhouse://" + n.Addr() + "/" + db
	if len(settings) > 0 {
		s += "?" + strings.Join(settings, "&")
	}
	return s
}

// Connect returns the connection to the node's default database, open for
// as long as the cluster runs.
func (n *Node) Connect(t testing.TB) driver.Conn {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		t.Fatalf("%s is not started", n.Name)
	}
	return n.conn
}

// Exec runs statements on the node, failing the test on the first error.
func (n *Node) Exec(t testing.TB, statements []string) {
	t.Helper()
	conn := n.Connect(t)
	for _, stmt := range statements {
		if err := conn.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("on %s: %v\n%s\n%s", n.Name, err, stmt, n.cluster.Diagnose())
		}
	}
}

// Kill kills the server (SIGKILL: no shutdown) and waits for it to exit.
func (n *Node) Kill() {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	p.Kill()
}

// Start starts the server again after Kill, with the same configuration and
// data, and waits until it answers.
func (n *Node) Start(t testing.TB) {
	t.Helper()
	n.start(t)
	n.waitReady(t)
}

func (n *Node) start(t testing.TB) {
	t.Helper()
	cmd := n.at.command(n.bin, "--config-file="+filepath.Join(n.Dir, "config.xml"))
	cmd.Dir = n.Dir
	p := StartProcess(t, "clickhouse "+n.Name, cmd)
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
}

func (n *Node) waitReady(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	p.WaitUntil(t, 90*time.Second, func() error { return testenv.PingClickHouse(n.Addr()) }, func() string {
		b, _ := os.ReadFile(filepath.Join(n.Dir, "log", "server.err.log"))
		return string(b)
	})
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn != nil {
		return
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{n.Addr()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("connect %s: %v", n.Name, err)
	}
	t.Cleanup(func() { conn.Close() })
	n.conn = conn
}

// Cluster is a ClickHouse cluster sharing one ZooKeeper: Shards[s][r] is
// replica r of shard s, every server with the {cluster}, {shard} and
// {replica} macros set.
type Cluster struct {
	Name   string
	Shards [][]*Node
}

// Diagnose describes every server for a failure message (a DDL ON CLUSTER
// that timed out, a replica that does not catch up): its replicated tables
// that are read-only, lost their ZooKeeper session or have entries in
// their replication queue, and the tail of its error log (where
// DDLWorker's errors go). A server that does not answer says so; nothing
// here fails the test.
func (c *Cluster) Diagnose() string {
	if c == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("cluster state:\n")
	for _, n := range c.Nodes() {
		fmt.Fprintf(&b, "== %s (%s)\n", n.Name, n.Addr())
		n.mu.Lock()
		conn := n.conn
		n.mu.Unlock()
		if conn == nil {
			b.WriteString("   not started\n")
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rows, err := conn.Query(ctx, "SELECT database, table, is_readonly, is_session_expired, queue_size FROM system.replicas WHERE is_readonly OR is_session_expired OR queue_size > 0")
			if err != nil {
				fmt.Fprintf(&b, "   system.replicas: %v\n", err)
			} else {
				for rows.Next() {
					var db, table string
					var ro, expired uint8
					var queue uint32
					if err := rows.Scan(&db, &table, &ro, &expired, &queue); err != nil {
						fmt.Fprintf(&b, "   system.replicas: %v\n", err)
						break
					}
					fmt.Fprintf(&b, "   %s.%s: read-only %d, session expired %d, queue %d\n", db, table, ro, expired, queue)
				}
				rows.Close()
			}
			cancel()
		}
		b.WriteString(indent(testenv.ClickHouseLogTail(n.Dir), "   "))
	}
	return b.String()
}

// indent prefixes every line of s with p.
func indent(s, p string) string {
	if s == "" {
		return ""
	}
	return p + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+p) + "\n"
}

// Nodes lists every server, shard by shard.
func (c *Cluster) Nodes() []*Node {
	var out []*Node
	for _, s := range c.Shards {
		out = append(out, s...)
	}
	return out
}

// Options are a Cluster's shape and places.
type Options struct {
	Name             string // the cluster's name in <remote_servers>
	ZooKeeper        string // host:port (StartZooKeeper)
	Shards, Replicas int
	// Place gives where replica r of shard s runs (nil: all on loopback).
	Place func(shard, replica int) Placement
	// ProfileXML is added to the default profile after the settings
	// deploy/clickhouse/cluster.sql asks for.
	ProfileXML string
}

// Start starts o.Shards × o.Replicas ClickHouse servers that use the
// ZooKeeper at o.ZooKeeper and know each other as cluster o.Name, and
// waits until each answers.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	bin := ServerBinary
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("clickhouse-server")
		if lerr != nil {
			t.Fatalf("clickhouse-server not found at %s nor on PATH: install Debian's clickhouse-server package "+
				"(apt-get install -y --no-install-recommends clickhouse-server), or run scripts/test", bin)
		}
		bin = p
	}
	zkHost, zkPort, err := net.SplitHostPort(o.ZooKeeper)
	if err != nil {
		t.Fatalf("chcluster: ZooKeeper address %q: %v", o.ZooKeeper, err)
	}
	c := &Cluster{Name: o.Name}
	for s := range o.Shards {
		var shard []*Node
		for r := range o.Replicas {
			var at Placement
			if o.Place != nil {
				at = o.Place(s, r)
			}
			shard = append(shard, &Node{
				Name:        fmt.Sprintf("s%dr%d", s+1, r+1),
				Shard:       fmt.Sprintf("%02d", s+1),
				Host:        at.host(),
				TCP:         at.port(t, 9000),
				HTTP:        at.port(t, 8123),
				Interserver: at.port(t, 9009),
				Dir:         t.TempDir(),
				at:          at,
				bin:         bin,
				cluster:     c,
			})
		}
		c.Shards = append(c.Shards, shard)
	}
	var remote strings.Builder
	fmt.Fprintf(&remote, "<%s>\n", o.Name)
	for _, shard := range c.Shards {
		remote.WriteString("<shard><internal_replication>true</internal_replication>\n")
		for _, n := range shard {
			fmt.Fprintf(&remote, "<replica><host>%s</host><port>%d</port></replica>\n", n.Host, n.TCP)
		}
		remote.WriteString("</shard>\n")
	}
	fmt.Fprintf(&remote, "</%s>\n", o.Name)

	for _, n := range c.Nodes() {
		err := testenv.WriteClickHouseConfig(n.Dir, testenv.ClickHouseConfig{TCPPort: n.TCP, HTTPPort: n.HTTP, ListenHost: n.at.Listen,
			ServerXML: fmt.Sprintf(`    <interserver_http_port>%d</interserver_http_port>
    <interserver_http_host>%s</interserver_http_host>
    <zookeeper><node><host>%s</host><port>%s</port></node><session_timeout_ms>30000</session_timeout_ms></zookeeper>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
    <remote_servers>%s</remote_servers>
    <macros><cluster>%s</cluster><shard>%s</shard><replica>%s</replica></macros>`, n.Interserver, n.Host, zkHost, zkPort, remote.String(), o.Name, n.Shard, n.Name),
			// The settings deploy/clickhouse/cluster.sql asks for in rollgate's profile.
			ProfileXML: `<insert_distributed_sync>1</insert_distributed_sync><load_balancing>in_order</load_balancing>` + o.ProfileXML,
		})
		if err != nil {
			t.Fatal(err)
		}
		n.start(t)
	}
	for _, n := range c.Nodes() {
		n.waitReady(t)
	}
	return c
}

// Statements returns the statements of a SQL script such as
// deploy/clickhouse/cluster.sql with the database renamed from rollgate to
// db (as its header tells users to do), comments dropped.
func Statements(script, db string) []string {
	var lines []string
	for _, l := range strings.Split(script, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "--") {
			continue
		}
		lines = append(lines, l)
	}
	sql := regexp.MustCompile(`\brollgate\b`).ReplaceAllString(strings.Join(lines, "\n"), db)
	var out []string
	for _, s := range strings.Split(sql, ";") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads at once.
type syncBuffer = testenv.SyncBuffer
