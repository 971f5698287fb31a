package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
)

// TestBenchIdleAndRunRSS: `rollgate bench --idle N --pids PID` against a
// served gateway holds N idle keep-alive connections through the run (all
// still open at its end, exit status 0 with the capture checked) and reports
// the gateway's resident set before and with them, at the run's start and at
// most during it.
func TestBenchIdleAndRunRSS(t *testing.T) {
	ms, mockURL, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	addr, dir := freeAddr(t), t.TempDir()
	db := filepath.Join(dir, "rollgate.db")
	cmd, _ := start(t, addr, "/healthz", "serve", "--listen", addr, "--db", db, "--upstream", mockURL, "--upstream-kind", "vllm")
	report := filepath.Join(dir, "runs.jsonl")
	out, err := exec.Command(binary, "bench", "--url", "http://"+addr, "--agents", "4", "--turns", "2", "--stream",
		"--rollouts", "8", "--idle", "50", "--pids", strconv.Itoa(cmd.Process.Pid), "--db", db, "--json", report).CombinedOutput()
	if err != nil {
		t.Fatalf("rollgate bench: %v\n%s", err, out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	r := gjson.ParseBytes(b)
	if r.Get("idle").Int() != 50 || r.Get("idle_open").Int() != 50 {
		t.Errorf("idle %d, still open %d; want 50 and 50\n%s", r.Get("idle").Int(), r.Get("idle_open").Int(), b)
	}
	bare, idle := r.Get("proc.bare_rss_mib").Float(), r.Get("proc.idle_rss_mib").Float()
	startRSS, run := r.Get("proc.start_rss_mib").Float(), r.Get("proc.run_rss_mib").Float()
	if bare <= 1 || idle < bare || startRSS <= 1 || run < startRSS*0.5 {
		t.Errorf("RSS figures: bare %.1f, with idle %.1f, start %.1f, during run %.1f MiB\n%s", bare, idle, startRSS, run, b)
	}
	if r.Get("capture.missing").Int() != 0 || r.Get("capture.found").Int() != 16 {
		t.Errorf("capture: %s", r.Get("capture").Raw)
	}
}

// TestBenchIdleRefused: connections to a server that does not answer 200
// to --idle-path fail the run before it starts, naming the status.
func TestBenchIdleRefused(t *testing.T) {
	ms, mockURL, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	out, err := exec.Command(binary, "bench", "--url", mockURL[:len(mockURL)-len("/v1")], "--paths", "plain", "--rollouts", "1",
		"--idle", "3", "--idle-path", "/no/such/path").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "idle connection") || !strings.Contains(string(out), "404") {
		t.Fatalf("err %v, output %s: want a failure naming the idle connection and 404", err, out)
	}
}
