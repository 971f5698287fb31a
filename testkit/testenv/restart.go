package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ClickHouseServer is a ClickHouse server of a test's own that can be stopped
// and started again on the same ports and data folder, to simulate an outage
// of the store. It always runs its own clickhouse-server, even when
// ROLLGATE_TEST_CLICKHOUSE_DSN is set (a shared server cannot be stopped).
// Its methods are safe for concurrent use.
type ClickHouseServer struct {
	bin      string
	dir      string
	tcpPort  int
	httpPort int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives the Wait result of cmd, once
}

// StartRestartableClickHouse starts a ClickHouse server in a fresh temporary
// folder on free loopback ports and waits up to StartTimeout for it to answer.
// Stop and Start take it down and bring it back with the same data; Close
// stops it and removes the folder.
func StartRestartableClickHouse() (*ClickHouseServer, error) {
	bin, err := findServer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "rollgate-clickhouse-restart-")
	if err != nil {
		return nil, fmt.Errorf("clickhouse test server: temp dir: %w", err)
	}
	s := &ClickHouseServer{bin: bin, dir: dir}
	if s.tcpPort, err = freePort(); err == nil {
		s.httpPort, err = freePort()
	}
	if err == nil {
		err = writeConfig(dir, s.tcpPort, s.httpPort)
	}
	if err == nil {
		err = s.Start()
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Addr is the server's native-protocol address, 127.0.0.1:PORT.
func (s *ClickHouseServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.tcpPort) }

// DSN is clickhouse://127.0.0.1:PORT/default; it stays valid across restarts.
func (s *ClickHouseServer) DSN() string { return "clickhouse://" + s.Addr() + "/default" }

// Running reports whether the server process is running.
func (s *ClickHouseServer) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Start runs the server (again) on the same ports and data folder and waits
// up to StartTimeout for it to answer a ping. Starting a running server is an
// error.
func (s *ClickHouseServer) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("clickhouse test server: already running")
	}
	out, err := os.OpenFile(filepath.Join(s.dir, "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("clickhouse test server: %w", err)
	}
	cmd := exec.Command(s.bin, "--config-file="+filepath.Join(s.dir, "config.xml"))
	cmd.Dir = s.dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("clickhouse test server: start %s: %w", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); out.Close() }()
	if err := waitReady(s.Addr(), exited); err != nil {
		stopProcess(cmd, exited)
		return fmt.Errorf("clickhouse test server %s did not start: %w\n%s", s.Addr(), err, logTail(s.dir))
	}
	s.cmd, s.exited = cmd, exited
	return nil
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 15 s) and waits
// until the process has exited. The data folder is kept for Start. Stopping a
// stopped server does nothing.
func (s *ClickHouseServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	stopProcess(s.cmd, s.exited)
	s.cmd, s.exited = nil, nil
}

// Kill stops the server with SIGKILL, as a crash would, and waits until the
// process has exited. The data folder is kept for Start.
func (s *ClickHouseServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
}

// Close stops the server and removes its folder.
func (s *ClickHouseServer) Close() {
	s.Stop()
	_ = os.RemoveAll(s.dir)
}

func stopProcess(cmd *exec.Cmd, exited <-chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}
