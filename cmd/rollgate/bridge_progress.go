package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	bridge "github.com/rollgate/rollgate/trainer-bridge"
)

// progressReporter shows a Build's progress on stderr: on a terminal a bar
// redrawn in place at most every redraw (calls read, samples written, rate,
// ETA); elsewhere, or with --quiet, a plain line every interval and one when
// each phase ends, for logs.
type progressReporter struct {
	w        io.Writer
	tty      bool
	redraw   time.Duration // between redraws of the bar (terminal)
	interval time.Duration // between lines (not a terminal)
	now      func() time.Time

	phase      string
	phaseStart time.Time
	last       time.Time // last drawing or line
	width      int       // of the last bar drawn, to blank its rest
	prev       bridge.Progress
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// newProgressReporter draws on w; tty chooses the bar over log lines.
func newProgressReporter(w io.Writer, tty bool) *progressReporter {
	return &progressReporter{w: w, tty: tty, redraw: 100 * time.Millisecond, interval: 10 * time.Second, now: time.Now}
}

// update is bridge.Options.Progress.
func (r *progressReporter) update(p *bridge.Progress) {
	now := r.now()
	if p.Phase != r.phase {
		if r.phase != "" {
			r.finish(now)
		}
		r.phase, r.phaseStart, r.last = p.Phase, now, now
	}
	r.prev = *p
	total, done := p.TotalAttempts, p.Attempts
	if p.Phase == bridge.PhaseWrite {
		total, done = p.TotalSamples, p.Samples
	}
	if done >= total && total > 0 {
		r.finish(now)
		r.phase = "" // a phase's end is told once
		return
	}
	if r.tty && now.Sub(r.last) >= r.redraw || !r.tty && now.Sub(r.last) >= r.interval {
		r.draw(now, false)
		r.last = now
	}
}

// finish draws the phase's last state and ends its line.
func (r *progressReporter) finish(now time.Time) {
	if r.phase == "" {
		return
	}
	r.draw(now, true)
}

// draw writes the current state: the bar in place (terminal) or a line.
func (r *progressReporter) draw(now time.Time, final bool) {
	p := r.prev
	secs := now.Sub(r.phaseStart).Seconds()
	var done, total int
	var unit, extra string
	if r.phase == bridge.PhaseWrite {
		done, total, unit = p.Samples, p.TotalSamples, "samples written"
	} else {
		done, total, unit = p.Attempts, p.TotalAttempts, "attempts read"
		extra = fmt.Sprintf(" · %s calls", count(p.Calls))
	}
	rate := 0.0
	if secs > 0 {
		rate = float64(done) / secs
	}
	perSec := fmt.Sprintf(" · %s/s", count(int(rate)))
	if r.phase != bridge.PhaseWrite && secs > 0 {
		perSec = fmt.Sprintf(" · %s calls/s", count(int(float64(p.Calls)/secs)))
	}
	eta := ""
	switch {
	case final:
		eta = fmt.Sprintf(" · %s", clock(now.Sub(r.phaseStart)))
	case rate > 0 && total > done:
		eta = " · ETA " + clock(time.Duration(float64(total-done)/rate*float64(time.Second)))
	}
	pct := 100
	if total > 0 {
		pct = done * 100 / total
	}
	line := fmt.Sprintf("rollgate bridge: %s %3d%% %s/%s %s%s%s%s", r.phase, pct, count(done), count(total), unit, extra, perSec, eta)
	if !r.tty {
		fmt.Fprintln(r.w, line)
		return
	}
	const barWidth = 24
	fill := barWidth * pct / 100
	line = fmt.Sprintf("rollgate bridge: %-5s [%s%s] %s", r.phase, strings.Repeat("#", fill), strings.Repeat(".", barWidth-fill), strings.TrimPrefix(line, "rollgate bridge: "+r.phase+" "))
	pad := max(r.width-len(line), 0)
	r.width = len(line)
	fmt.Fprintf(r.w, "\r%s%s", line, strings.Repeat(" ", pad))
	if final {
		fmt.Fprintln(r.w)
		r.width = 0
	}
}

// count writes n with thousands separators: 1,234,567.
func count(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// clock writes d as m:ss, or h:mm:ss from an hour.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, s)
	}
	return fmt.Sprintf("%d:%02d", m, s)
}
