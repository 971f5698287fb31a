package load

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// ProcUsage is what a set of processes (and their descendants) used
// during a run, read from /proc.
type ProcUsage struct {
	PIDs       []int   `json:"pids"`
	CPUSeconds float64 `json:"cpu_s"`
	CPUPer1000 float64 `json:"cpu_s_per_1000"`
	// CPUByPID is CPUSeconds split by the pids given to Snapshot (each with
	// its descendants), so that one run can measure a gateway and the engine
	// behind it apart.
	CPUByPID map[int]float64 `json:"cpu_s_by_pid,omitempty"`
	// PeakRSSMiB is the sum of VmHWM (peak resident set since the process
	// started, not only during the run) over the processes.
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// RunRSSMiB is the highest resident set (VmRSS, descendants included)
	// sampled every 50 ms during the measured run: unlike PeakRSSMiB, what
	// this run's load held, not an earlier one's.
	RunRSSMiB float64 `json:"run_rss_mib,omitempty"`
	// StartRSSMiB is the resident set just before the measured run (after
	// the warm-up and the idle connections).
	StartRSSMiB float64 `json:"start_rss_mib,omitempty"`
	// BareRSSMiB is the resident set before the idle connections were
	// opened (only with idle connections).
	BareRSSMiB float64 `json:"bare_rss_mib,omitempty"`
	// IdleRSSMiB is the resident set once the idle connections were opened
	// (before the warm-up; only with idle connections).
	IdleRSSMiB float64 `json:"idle_rss_mib,omitempty"`
}

// ProcSnapshot is the CPU time used so far by processes and their descendants.
type ProcSnapshot struct {
	pids  []int
	ticks map[int]uint64
	root  map[int]int // process → the pid given to Snapshot it was found under
}

// Snapshot reads the CPU time of pids and of their descendants at the time
// (nginx's workers, a wrapper's child, vLLM's API server under a launcher
// and its EngineCore and worker processes below it); a process in the tree
// of more than one pid counts once, under the first.
func Snapshot(pids []int) (*ProcSnapshot, error) {
	s := &ProcSnapshot{ticks: map[int]uint64{}, root: map[int]int{}}
	for _, pid := range pids {
		for _, p := range descendants(pid) {
			if _, seen := s.ticks[p]; seen {
				continue
			}
			t, err := cpuTicks(p)
			if err != nil {
				return nil, err
			}
			s.pids = append(s.pids, p)
			s.ticks[p] = t
			s.root[p] = pid
		}
	}
	return s, nil
}

// maxDescendants bounds the processes Snapshot follows under one pid.
const maxDescendants = 4096

// descendants returns pid and the processes below it, parents first.
func descendants(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && len(out) < maxDescendants; i++ {
		out = append(out, children(out[i])...)
	}
	return out
}

// Since returns the usage of the snapshot's processes since it was taken,
// with CPU per 1,000 calls for calls > 0.
func (s *ProcSnapshot) Since(calls int) (*ProcUsage, error) {
	u := &ProcUsage{PIDs: s.pids, CPUByPID: map[int]float64{}}
	var ticks uint64
	for _, p := range s.pids {
		t, err := cpuTicks(p)
		if err != nil {
			return nil, err
		}
		d := t - min(t, s.ticks[p])
		ticks += d
		u.CPUByPID[s.root[p]] += float64(d) / clockTicks
		hwm, err := peakRSS(p)
		if err != nil {
			return nil, err
		}
		u.PeakRSSMiB += float64(hwm) / 1024
	}
	u.CPUSeconds = float64(ticks) / clockTicks
	if calls > 0 {
		u.CPUPer1000 = u.CPUSeconds * 1000 / float64(calls)
	}
	return u, nil
}

// cpuTicks returns utime+stime of pid from /proc/PID/stat.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("load: process %d: %w", pid, err)
	}
	return parseStat(b)
}

// parseStat returns utime+stime (fields 14 and 15) of a /proc/PID/stat line.
// The command name (field 2) is in parentheses and may contain spaces.
func parseStat(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("load: malformed /proc stat %.60q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("load: short /proc stat %.60q", b)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("load: malformed /proc stat times %q %q", f[11], f[12])
	}
	return ut + st, nil
}

// peakRSS returns VmHWM of pid in KiB.
func peakRSS(pid int) (uint64, error) { return statusKiB(pid, "VmHWM:") }

// statusKiB returns the value (KiB) of the line starting with key
// (e.g. "VmRSS:") of /proc/PID/status.
func statusKiB(pid int, key string) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("load: process %d: %w", pid, err)
	}
	return parseStatusKiB(b, key)
}

// parseHWM returns the VmHWM line's value (KiB) of a /proc/PID/status file.
func parseHWM(b []byte) (uint64, error) { return parseStatusKiB(b, "VmHWM:") }

// parseStatusKiB returns the value (KiB) of the line starting with key of a
// /proc/PID/status file.
func parseStatusKiB(b []byte, key string) (uint64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			return strconv.ParseUint(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("load: no %s line in /proc status", strings.TrimSuffix(key, ":"))
}

// RSS returns the resident set (VmRSS) of pids and their descendants, in
// MiB, now: unlike VmHWM it falls when a process returns memory, so that
// samples taken during a run measure that run alone.
func RSS(pids []int) (float64, error) {
	var kib uint64
	seen := map[int]bool{}
	for _, pid := range pids {
		for _, p := range descendants(pid) {
			if seen[p] {
				continue
			}
			seen[p] = true
			v, err := statusKiB(p, "VmRSS:")
			if err != nil {
				return 0, err
			}
			kib += v
		}
	}
	return float64(kib) / 1024, nil
}

// RSSSampler records the highest RSS of a set of processes sampled at a
// fixed interval until stopped.
type RSSSampler struct {
	stop chan struct{}
	done chan struct{}
	peak float64
	err  error
}

// SampleRSS starts sampling RSS(pids) every interval (and once at once).
func SampleRSS(pids []int, every time.Duration) *RSSSampler {
	s := &RSSSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			v, err := RSS(pids)
			if err != nil {
				s.err = err
				return
			}
			s.peak = max(s.peak, v)
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling and returns the highest RSS seen, in MiB.
func (s *RSSSampler) Stop() (float64, error) {
	close(s.stop)
	<-s.done
	return s.peak, s.err
}

// children returns the direct children of pid (all its threads' children).
func children(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}
