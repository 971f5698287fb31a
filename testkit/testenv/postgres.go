package testenv

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

// EnvPostgresDSN names the environment variable that points tests at an
// already running PostgreSQL instead of starting one.
const EnvPostgresDSN = "ROLLGATE_TEST_POSTGRES_DSN"

// PostgresBinDir is where Debian's postgresql package installs initdb and
// postgres; when it is missing, the newest /usr/lib/postgresql/*/bin is used.
var PostgresBinDir = "/usr/lib/postgresql/15/bin"

// StartPostgres returns the DSN of a PostgreSQL server for tests and a
// function that stops it. When ROLLGATE_TEST_POSTGRES_DSN is set it returns
// that. Otherwise it runs initdb and postgres from Debian's package in a fresh
// temporary folder, listening on 127.0.0.1 on a free port (its socket in the
// folder too), with trust authentication for the user "rollgate". PostgreSQL
// refuses to run as root, so as root the server runs as the "postgres" system
// user the package creates.
func StartPostgres() (dsn string, stop func(), err error) {
	if dsn := os.Getenv(EnvPostgresDSN); dsn != "" {
		return dsn, func() {}, nil
	}
	return StartPostgresWith(PostgresOptions{})
}

// PostgresOptions place the server StartPostgresWith starts.
type PostgresOptions struct {
	// Listen is the address it listens on (default 127.0.0.1).
	Listen string
	// Port is its port (default: a free one, see FreePort).
	Port int
	// Command makes the server's command (default exec.Command): e.g. to
	// run it in another network namespace (testkit/netns Host.Command).
	Command func(name string, args ...string) *exec.Cmd
}

// StartPostgresWith is StartPostgres on the address and with the command
// o gives; it ignores ROLLGATE_TEST_POSTGRES_DSN.
func StartPostgresWith(o PostgresOptions) (dsn string, stop func(), err error) {
	if o.Listen == "" {
		o.Listen = "127.0.0.1"
	}
	custom := o.Command != nil
	if !custom {
		o.Command = exec.Command
	}
	bin, err := postgresBin()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "rollgate-postgres-")
	if err != nil {
		return "", nil, fmt.Errorf("postgres test server: temp dir: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	attr := sysProcAttr()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			cleanup()
			return "", nil, fmt.Errorf("postgres test server: running as root needs the postgres system user (apt-get install postgresql): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("postgres test server: %w", err)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "rollgate", "--auth=trust",
		"--no-sync", "-E", "UTF8", "--locale=C")
	initdb.SysProcAttr = attr
	if out, err := initdb.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("postgres test server: initdb: %w\n%s", err, out)
	}
	if o.Listen != "127.0.0.1" {
		// Clients come from other addresses (hosts of testkit/netns).
		if err := appendFile(filepath.Join(data, "pg_hba.conf"), "host all all 0.0.0.0/0 trust\n"); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("postgres test server: %w", err)
		}
	}
	port := o.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			cleanup()
			return "", nil, err
		}
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("postgres test server: %w", err)
	}
	args := []string{filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=" + o.Listen, "-c", "unix_socket_directories=" + dir,
		"-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB"}
	var cmd *exec.Cmd
	if custom && attr.Credential != nil {
		// The command may need root first (ip netns exec): the user
		// changes last, with setpriv, which also sets the parent-death
		// signal the change of user would clear.
		c := attr.Credential
		cmd = o.Command("setpriv", append([]string{"--reuid=" + strconv.Itoa(int(c.Uid)), "--regid=" + strconv.Itoa(int(c.Gid)),
			"--clear-groups", "--pdeathsig=KILL", "--"}, args...)...)
	} else {
		cmd = o.Command(args[0], args[1:]...)
		cmd.SysProcAttr = attr
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		cleanup()
		return "", nil, fmt.Errorf("postgres test server: start: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		cleanup()
	}
	hostPort := net.JoinHostPort(o.Listen, strconv.Itoa(port))
	dsn = fmt.Sprintf("postgres://rollgate@%s/postgres?sslmode=disable", hostPort)
	deadline := time.Now().Add(StartTimeout)
	for {
		if c, err := net.DialTimeout("tcp", hostPort, time.Second); err == nil {
			c.Close()
			if db, err := sql.Open("pgx", dsn); err == nil {
				err = db.Ping()
				db.Close()
				if err == nil {
					return dsn, stop, nil
				}
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			exited <- err
			stop()
			return "", nil, fmt.Errorf("postgres test server exited: %v\n%s", err, log)
		case <-time.After(100 * time.Millisecond): // polling interval of this wait on a connection
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			stop()
			return "", nil, fmt.Errorf("postgres test server on port %d did not answer within %s\n%s", port, StartTimeout, log)
		}
	}
}

// FreshPostgresDatabase creates an empty database named after name on the
// server at dsn and returns a DSN pointing at it.
func FreshPostgresDatabase(dsn, name string) (string, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", fmt.Errorf("postgres: %w", err)
	}
	defer db.Close()
	id := strings.ToLower(Identifier(name))
	if len(id) > 60 {
		id = id[:60]
	}
	if _, err := db.Exec(`DROP DATABASE IF EXISTS ` + id); err != nil {
		return "", fmt.Errorf("postgres: drop %s: %w", id, err)
	}
	if _, err := db.Exec(`CREATE DATABASE ` + id); err != nil {
		return "", fmt.Errorf("postgres: create %s: %w", id, err)
	}
	i := strings.LastIndex(dsn, "/")
	q := strings.IndexByte(dsn[i:], '?')
	if q < 0 {
		return dsn[:i+1] + id, nil
	}
	return dsn[:i+1] + id + dsn[i+q:], nil
}

func postgresBin() (string, error) {
	if _, err := os.Stat(filepath.Join(PostgresBinDir, "postgres")); err == nil {
		return PostgresBinDir, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	return "", fmt.Errorf("postgres not found in %s or /usr/lib/postgresql/*/bin: apt-get install postgresql (or run ./scripts/test), or set %s", PostgresBinDir, EnvPostgresDSN)
}

// PostgresMain is a TestMain body for packages whose tests need PostgreSQL:
// it starts the server (or takes ROLLGATE_TEST_POSTGRES_DSN), stores its DSN
// in *dsn, runs the tests, stops the server and exits. A server that cannot
// be started fails the whole test binary.
func PostgresMain(m *testing.M, dsn *string) { runWith(m, dsn, StartPostgres) }

// appendFile appends text to the file at path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
