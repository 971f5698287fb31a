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
	port, err := freePort()
	if err != nil {
		cleanup()
		return "", nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("postgres test server: %w", err)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = attr
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
	dsn = fmt.Sprintf("postgres://rollgate@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(StartTimeout)
	for {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
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
