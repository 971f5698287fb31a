//go:build linux

package netns

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// envEcho makes the test binary an echo server on the address it holds
// (run in a host by Host.Command).
const envEcho = "ROLLGATE_NETNS_ECHO"

func TestMain(m *testing.M) {
	if addr := os.Getenv(envEcho); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			go io.Copy(c, c)
		}
	}
	os.Exit(m.Run())
}

// echoOn starts the echo server on h:port and waits until it answers.
func echoOn(t *testing.T, h *Host, port int) string {
	t.Helper()
	addr := h.Addr(port)
	cmd := h.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envEcho+"="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testenv.WaitFor(t, 10*time.Second, func() string { return "the echo server on " + addr }, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// TestCutIsSilentAndHeals: across a cut link an open connection neither
// fails nor gets an answer (no reset, no error: the write succeeds, the
// read times out), a new connection times out (not refused), and once
// healed the same connection delivers what was written during the cut.
// Hosts reach each other through the bridge, and Close removes everything.
func TestCutIsSilentAndHeals(t *testing.T) {
	n := New(t)
	a, b := n.Host("a"), n.Host("b")
	addr := echoOn(t, a, 7000)
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string, wait time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return "", fmt.Errorf("write: %w", err)
		}
		c.SetReadDeadline(time.Now().Add(wait))
		return r.ReadString('\n')
	}
	if got, err := roundTrip("one", 2*time.Second); err != nil || got != "one\n" {
		t.Fatalf("before the cut: %q %v", got, err)
	}

	n.Cut(n.Root(), a)
	got, err := roundTrip("two", time.Second)
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("across the cut: got %q, err %v; want a read timeout (silent drop, no reset)", got, err)
	}
	if d, err := net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		if d != nil {
			d.Close()
		}
		t.Fatalf("a new connection across the cut: %v; want a timeout (not refused)", err)
	}

	n.Heal(n.Root(), a)
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // TCP retransmits what the cut dropped
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after healing: %q %v; want the write made during the cut echoed", got, err)
	}

	// Host to host, through the bridge's forward path: b reaches a, and a
	// cut between them stops it while the test process still reaches a.
	probe := func() error {
		out, err := b.Command("bash", "-c", "exec 3<>/dev/tcp/"+a.IP.String()+"/7000 && echo hi >&3 && head -c3 <&3").CombinedOutput()
		if err != nil || string(out) != "hi\n" {
			return fmt.Errorf("%v %q", err, out)
		}
		return nil
	}
	if err := probe(); err != nil {
		t.Fatalf("b to a: %v", err)
	}
	n.Cut(a, b)
	done := make(chan error, 1)
	go func() { done <- probe() }()
	select {
	case err := <-done:
		t.Fatalf("b to a across the cut finished: %v; want it stalled", err)
	case <-time.After(time.Second): // the probe must still be waiting: this is the observation window, not a wait for a condition
	}
	if got, err := roundTrip("three", 2*time.Second); err != nil || got != "three\n" {
		t.Fatalf("the test process to a, with only a-b cut: %q %v", got, err)
	}
	n.Heal(a, b)
	if err := <-done; err != nil {
		t.Fatalf("b to a after healing: %v", err)
	}

	n.Close()
	out, _ := ipOut("netns", "list")
	if strings.Contains(out, n.id) {
		t.Fatalf("namespaces left after Close:\n%s", out)
	}
	out, _ = ipOut("-o", "link", "show")
	if strings.Contains(out, n.id) {
		t.Fatalf("links left after Close:\n%s", out)
	}
}

// ipOut runs ip and returns its output.
func ipOut(args ...string) (string, error) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	return string(out), err
}
