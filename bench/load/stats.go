package load

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Percentiles are exact order statistics of a sample (nearest rank), in
// microseconds so that they print and compare without unit juggling.
type Percentiles struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_us"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p999_us"`
	Max  float64 `json:"max_us"`
}

// Percentile returns the nearest-rank q-quantile (0 < q <= 1) of sorted, or 0
// when it is empty.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = min(max(i, 0), len(sorted)-1)
	return sorted[i]
}

// Summarize sorts samples in place and returns their percentiles.
func Summarize(samples []time.Duration) Percentiles {
	if len(samples) == 0 {
		return Percentiles{}
	}
	slices.Sort(samples)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return Percentiles{
		N:    len(samples),
		Mean: us(sum) / float64(len(samples)),
		P50:  us(Percentile(samples, 0.50)),
		P90:  us(Percentile(samples, 0.90)),
		P99:  us(Percentile(samples, 0.99)),
		P999: us(Percentile(samples, 0.999)),
		Max:  us(samples[len(samples)-1]),
	}
}

// Report is the summary of a run, as printed and as written in JSON for
// comparisons (rollgate bench --json; rollgate bench table).
type Report struct {
	Label      string         `json:"label"`
	Scenario   string         `json:"scenario"`
	Mode       string         `json:"mode"`
	Stream     bool           `json:"stream"`
	Agents     int            `json:"agents"`
	Turns      int            `json:"turns"`
	Rate       float64        `json:"rate,omitempty"`
	ElapsedSec float64        `json:"elapsed_s"`
	Requests   int            `json:"requests"`
	OK         int            `json:"ok"`
	Errors     int            `json:"errors"`
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	ToolCalls  int            `json:"tool_calls"`
	Throughput float64        `json:"throughput_rps"` // successful calls per second
	Latency    Percentiles    `json:"latency"`
	TTFT       Percentiles    `json:"ttft"`
	Capture    *Capture       `json:"capture,omitempty"`
	Proc       *ProcUsage     `json:"proc,omitempty"`
	// Idle is the number of idle keep-alive connections held open during
	// the run (rollgate bench --idle), IdleOpen how many of them the server
	// still held open at its end.
	Idle     int `json:"idle,omitempty"`
	IdleOpen int `json:"idle_open,omitempty"`
}

// Summary computes the report of r (without capture or process figures).
func (r *Result) Summary() *Report {
	rep := &Report{
		Mode: r.Config.Mode, Stream: r.Config.Stream, Agents: r.Config.Agents, Turns: r.Config.Turns,
		ElapsedSec: r.Elapsed.Seconds(), Requests: len(r.Calls), ErrorKinds: map[string]int{},
	}
	if r.Config.Mode == ModeOpen {
		rep.Rate = r.Config.Rate
		rep.Agents, rep.Turns = 0, 1
	}
	var lat, ttft []time.Duration
	for i := range r.Calls {
		c := &r.Calls[i]
		if !c.OK() {
			rep.Errors++
			rep.ErrorKinds[errorKind(c)]++
			continue
		}
		rep.OK++
		if c.ToolCall {
			rep.ToolCalls++
		}
		lat = append(lat, c.Latency)
		if c.Stream && c.TTFT > 0 {
			ttft = append(ttft, c.TTFT)
		}
	}
	if len(rep.ErrorKinds) == 0 {
		rep.ErrorKinds = nil
	}
	if r.Elapsed > 0 {
		rep.Throughput = float64(rep.OK) / r.Elapsed.Seconds()
	}
	rep.Latency = Summarize(lat)
	rep.TTFT = Summarize(ttft)
	return rep
}

// errorKind groups errors for the report: the HTTP status or the error's
// first words.
func errorKind(c *Call) string {
	if c.Status != 0 && c.Status != 200 {
		return fmt.Sprintf("HTTP %d", c.Status)
	}
	e := c.Err
	if i := strings.IndexByte(e, ':'); i > 0 {
		e = e[:i]
	}
	return e
}

// Print writes the report as text.
func (rep *Report) Print(w io.Writer) {
	kind := "non-streaming"
	if rep.Stream {
		kind = "streaming"
	}
	if rep.Mode == ModeOpen {
		fmt.Fprintf(w, "open loop at %.0f calls/s, %s, %.1fs\n", rep.Rate, kind, rep.ElapsedSec)
	} else {
		fmt.Fprintf(w, "closed loop: %d agents x %d turns, %s, %.1fs\n", rep.Agents, rep.Turns, kind, rep.ElapsedSec)
	}
	fmt.Fprintf(w, "calls       %d ok, %d errors (%d tool calls)\n", rep.OK, rep.Errors, rep.ToolCalls)
	if len(rep.ErrorKinds) > 0 {
		kinds := make([]string, 0, len(rep.ErrorKinds))
		for k := range rep.ErrorKinds {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			fmt.Fprintf(w, "  error     %6d  %s\n", rep.ErrorKinds[k], k)
		}
	}
	fmt.Fprintf(w, "throughput  %.1f calls/s\n", rep.Throughput)
	pr := func(name string, p Percentiles) {
		fmt.Fprintf(w, "%-11s p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (n=%d)\n", name,
			fmtUS(p.P50), fmtUS(p.P90), fmtUS(p.P99), fmtUS(p.P999), fmtUS(p.Max), p.N)
	}
	pr("latency", rep.Latency)
	if rep.TTFT.N > 0 {
		pr("ttft", rep.TTFT)
	}
	if c := rep.Capture; c != nil {
		fmt.Fprintf(w, "capture     %d expected, %d found, %d missing, %d duplicate, %d bad token ids, %d mismatched, %d extra rows (waited %.1fs)\n",
			c.Expected, c.Found, c.Missing, c.Duplicate, c.BadTokens, c.Mismatch, c.Extra, c.WaitedSec)
		for _, ex := range c.Examples {
			fmt.Fprintf(w, "  e.g.      %s\n", ex)
		}
	}
	if p := rep.Proc; p != nil {
		fmt.Fprintf(w, "process     pids %v: %.2f CPU s (%.3f per 1,000 calls), peak RSS %.1f MiB\n",
			p.PIDs, p.CPUSeconds, p.CPUPer1000, p.PeakRSSMiB)
		if p.RunRSSMiB > 0 {
			fmt.Fprintf(w, "rss         %.1f MiB at the start, %.1f MiB at most during the run", p.StartRSSMiB, p.RunRSSMiB)
			if p.BareRSSMiB > 0 {
				fmt.Fprintf(w, "; %.1f MiB before the idle connections, %.1f MiB with them", p.BareRSSMiB, p.IdleRSSMiB)
			}
			fmt.Fprintln(w)
		}
	}
	if rep.Idle > 0 {
		fmt.Fprintf(w, "idle        %d keep-alive connections held, %d still open at the end\n", rep.Idle, rep.IdleOpen)
	}
}

// fmtUS formats microseconds with a readable unit.
func fmtUS(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2fs", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%.2fms", us/1e3)
	default:
		return fmt.Sprintf("%.0fµs", us)
	}
}
