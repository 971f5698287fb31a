// Package testenv starts real servers for tests: a ClickHouse server run as a
// plain child process with its own config, data folder and free loopback ports.
//
// A package whose tests need ClickHouse starts one server per test binary in
// TestMain (see Main) and gives each test its own database (FreshDatabase).
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// EnvClickHouseDSN names the environment variable that points tests at an
// already running ClickHouse instead of starting one.
const EnvClickHouseDSN = "ROLLGATE_TEST_CLICKHOUSE_DSN"

// ServerBinary is where Debian's clickhouse-server package installs the
// server; when it is missing, clickhouse-server is looked up in PATH.
var ServerBinary = "/usr/sbin/clickhouse-server"

// StartTimeout bounds how long StartClickHouse waits for the server to answer.
var StartTimeout = 60 * time.Second

// StartClickHouse returns the DSN of a ClickHouse server for tests and a
// function that stops it. When ROLLGATE_TEST_CLICKHOUSE_DSN is set, it returns
// that DSN and a no-op stop. Otherwise it runs clickhouse-server in a fresh
// temporary folder listening on 127.0.0.1 (free TCP and HTTP ports), waits up
// to StartTimeout for it to answer a ping, and returns
// clickhouse://127.0.0.1:PORT/default. stop kills the server and removes the folder.
func StartClickHouse() (dsn string, stop func(), err error) {
	if dsn := os.Getenv(EnvClickHouseDSN); dsn != "" {
		return dsn, func() {}, nil
	}
	bin, err := findServer()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "rollgate-clickhouse-")
	if err != nil {
		return "", nil, fmt.Errorf("clickhouse test server: temp dir: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	tcpPort, err := freePort()
	if err != nil {
		cleanup()
		return "", nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		cleanup()
		return "", nil, err
	}
	if err := writeConfig(dir, tcpPort, httpPort); err != nil {
		cleanup()
		return "", nil, err
	}

	out, err := os.Create(filepath.Join(dir, "log", "stdout.log"))
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("clickhouse test server: %w", err)
	}
	cmd := exec.Command(bin, "--config-file="+filepath.Join(dir, "config.xml"))
	cmd.Dir = dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		cleanup()
		return "", nil, fmt.Errorf("clickhouse test server: start %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); out.Close() }()

	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		cleanup()
	}

	addr := fmt.Sprintf("127.0.0.1:%d", tcpPort)
	if err := waitReady(addr, exited); err != nil {
		tail := logTail(dir)
		stop()
		return "", nil, fmt.Errorf("clickhouse test server %s did not start: %w\n%s", addr, err, tail)
	}
	return "clickhouse://" + addr + "/default", stop, nil
}

// Main is a TestMain body for packages whose tests need ClickHouse: it starts
// the server, stores its DSN in *dsn, runs the tests, stops the server and
// exits. A server that cannot be started fails the whole test binary.
func Main(m *testing.M, dsn *string) { runWith(m, dsn, StartClickHouse) }

// runWith starts a server with start, stores its DSN in *dsn, runs the
// tests, stops the server and exits.
func runWith(m *testing.M, dsn *string, start func() (string, func(), error)) {
	d, stop, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	*dsn = d
	code := m.Run()
	stop()
	os.Exit(code)
}

// FreshDatabase returns dsn with its database replaced by name, after turning
// name into a valid identifier (letters, digits and '_'; test names like
// "TestX/sub-case" become "TestX_sub_case").
func FreshDatabase(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Path = "/" + Identifier(name)
	return u.String()
}

// Identifier maps s to a ClickHouse/SQLite identifier: every character other
// than ASCII letters and digits becomes '_', and a leading digit gets a '_' prefix.
func Identifier(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' {
		b = append([]byte{'_'}, b...)
	}
	return string(b)
}

func findServer() (string, error) {
	if _, err := os.Stat(ServerBinary); err == nil {
		return ServerBinary, nil
	}
	if p, err := exec.LookPath("clickhouse-server"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("clickhouse-server not found at %s nor in PATH: install it: apt-get install clickhouse-server (or run ./scripts/test), or set %s to a running server's DSN", ServerBinary, EnvClickHouseDSN)
}

func freePort() (int, error) { return FreePort() }

// writeConfig writes the configuration of a single test server.
func writeConfig(dir string, tcpPort, httpPort int) error {
	return WriteClickHouseConfig(dir, ClickHouseConfig{TCPPort: tcpPort, HTTPPort: httpPort})
}

// ClickHouseConfig is what WriteClickHouseConfig varies between test servers.
type ClickHouseConfig struct {
	TCPPort, HTTPPort int
	// ListenHost is the address the server listens on (default 127.0.0.1).
	// On another address (a host of testkit/netns) user default accepts
	// connections from any address.
	ListenHost string
	// ServerXML is added inside config.xml's root element (for example
	// <zookeeper>, <remote_servers>, <macros> of a cluster member).
	ServerXML string
	// ProfileXML is added to the default profile in users.xml (settings
	// such as <insert_distributed_sync>1</insert_distributed_sync>).
	ProfileXML string
}

// WriteClickHouseConfig writes config.xml and users.xml in the 18.16 format
// (root element <yandex>, which newer servers still accept) with every path
// inside dir, listening on loopback only (or c.ListenHost), user default
// without a password.
func WriteClickHouseConfig(dir string, c ClickHouseConfig) error {
	networks := "<ip>127.0.0.1</ip>\n                <ip>::1</ip>"
	if c.ListenHost == "" {
		c.ListenHost = "127.0.0.1"
	} else if c.ListenHost != "127.0.0.1" {
		networks = "<ip>::/0</ip>"
	}
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("clickhouse test server: %w", err)
		}
	}
	config := fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>%[1]s/log/server.log</log>
        <errorlog>%[1]s/log/server.err.log</errorlog>
        <size>100M</size>
        <count>1</count>
    </logger>
    <listen_host>%[5]s</listen_host>
    <tcp_port>%[2]d</tcp_port>
    <http_port>%[3]d</http_port>
    <path>%[1]s/data/</path>
    <tmp_path>%[1]s/tmp/</tmp_path>
    <user_files_path>%[1]s/user_files/</user_files_path>
    <format_schema_path>%[1]s/format_schemas/</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
    <mlock_executable>false</mlock_executable>
%[4]s
</yandex>
`, dir, c.TCPPort, c.HTTPPort, c.ServerXML, c.ListenHost)
	users := `<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>4000000000</max_memory_usage>
` + c.ProfileXML + `
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                ` + networks + `
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
`
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(config), 0o644); err != nil {
		return fmt.Errorf("clickhouse test server: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(users), 0o644); err != nil {
		return fmt.Errorf("clickhouse test server: %w", err)
	}
	return nil
}

// waitReady pings addr until it answers, the process exits, or StartTimeout passes.
func waitReady(addr string, exited <-chan error) error {
	deadline := time.Now().Add(StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("server exited: %v", err)
		default:
		}
		last = PingClickHouse(addr)
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // polling interval of this wait on a ping
	}
	return fmt.Errorf("no answer within %s: %w", StartTimeout, last)
}

// PingClickHouse connects to the ClickHouse server at addr (native
// protocol) and pings it, within 2 s.
func PingClickHouse(addr string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return conn.Ping(ctx)
}

// ClickHouseLogTail returns the last lines of the logs of the ClickHouse
// server whose configuration WriteClickHouseConfig wrote into dir, for
// failure messages.
func ClickHouseLogTail(dir string) string { return logTail(dir) }

// logTail returns the last lines of the server's logs, for error messages.
func logTail(dir string) string {
	var b strings.Builder
	for _, name := range []string{"stdout.log", "server.err.log"} {
		data, err := os.ReadFile(filepath.Join(dir, "log", name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(&b, "%s: %v\n", name, err)
			continue
		}
		lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		fmt.Fprintf(&b, "--- %s (tail)\n%s\n", name, bytes.Join(lines, []byte("\n")))
	}
	return b.String()
}

// DropDatabase drops the database named in dsn if it exists, so that a test
// using a shared server (ROLLGATE_TEST_CLICKHOUSE_DSN) starts from nothing.
func DropDatabase(ctx context.Context, dsn string) error {
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("drop database: %w", err)
	}
	db := opts.Auth.Database
	if db == "" || db == "default" || db == "system" {
		return fmt.Errorf("drop database: refusing to drop %q", db)
	}
	opts.Auth.Database = ""
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return fmt.Errorf("drop database: %w", err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+db+"`"); err != nil {
		return fmt.Errorf("drop database %s: %w", db, err)
	}
	return nil
}
