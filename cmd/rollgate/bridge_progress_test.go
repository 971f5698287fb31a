package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	bridge "github.com/rollgate/rollgate/trainer-bridge"
)

// fakeClock advances by step at every reading.
type fakeClock struct {
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

// feed runs a Build's progress through r: attempts of 5 calls read, then samples written.
func feed(r *progressReporter, attempts, samples int) {
	p := &bridge.Progress{Phase: bridge.PhaseRead, TotalAttempts: attempts}
	for i := 1; i <= attempts; i++ {
		p.Attempts, p.Calls = i, 5*i
		r.update(p)
	}
	p.Phase, p.TotalSamples = bridge.PhaseWrite, samples
	r.update(p)
	for i := 1; i <= samples; i++ {
		p.Samples = i
		r.update(p)
	}
}

// TestProgressTerminal: on a terminal the bar is redrawn in place with the
// counts, rate and ETA, throttled, and each phase ends on its own line.
func TestProgressTerminal(t *testing.T) {
	var b bytes.Buffer
	r := newProgressReporter(&b, true)
	clk := &fakeClock{t: time.Unix(0, 0), step: 10 * time.Millisecond}
	r.now = clk.now
	feed(r, 1000, 5000)
	out := b.String()
	redraws := strings.Count(out, "\r")
	// 6,001 updates 10 ms apart, one redraw per 100 ms at most: ~600.
	if redraws < 100 || redraws > 700 {
		t.Fatalf("%d redraws for 6,001 updates", redraws)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per phase, got %d:\n%q", len(lines), out)
	}
	for _, want := range []string{"read  [", "attempts read", "calls/s", "ETA ", "1,000/1,000 attempts read · 5,000 calls", "100%"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("read line lacks %q: %q", want, lines[0][max(0, len(lines[0])-300):])
		}
	}
	last := lines[1][strings.LastIndex(lines[1], "\r")+1:]
	for _, want := range []string{"write [########################]", "5,000/5,000 samples written", "/s"} {
		if !strings.Contains(last, want) {
			t.Errorf("write line lacks %q: %q", want, last)
		}
	}
}

// TestProgressLog: not on a terminal (or --quiet), a plain line every 10 s
// and one at the end of each phase; no carriage returns.
func TestProgressLog(t *testing.T) {
	var b bytes.Buffer
	r := newProgressReporter(&b, false)
	clk := &fakeClock{t: time.Unix(0, 0), step: time.Second}
	r.now = clk.now
	feed(r, 30, 0)
	out := b.String()
	if strings.Contains(out, "\r") {
		t.Fatalf("carriage return in log output: %q", out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	// 30 updates a second apart (the phase starts at the first): lines 10 s
	// and 20 s in, and at the phase's end with its duration.
	if len(lines) != 3 || lines[0] != "rollgate bridge: read  36% 11/30 attempts read · 55 calls · 5 calls/s · ETA 0:17" ||
		lines[2] != "rollgate bridge: read 100% 30/30 attempts read · 150 calls · 5 calls/s · 0:29" {
		t.Fatalf("log lines:\n%s", out)
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -5: "-5"} {
		if got := count(n); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
}
