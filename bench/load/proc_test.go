package load

import (
	"math"
	"os/exec"
	"testing"
	"time"
)

// TestCPUByPID: a run's CPU is split by the pids given to Snapshot, so a
// gateway and its engine can be measured apart in one run: a busy process's
// share grows, an idle one's stays near zero, and the shares add up.
func TestCPUByPID(t *testing.T) {
	busy := exec.Command("sh", "-c", "while :; do :; done")
	idle := exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{busy, idle} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	pb, pi := busy.Process.Pid, idle.Process.Pid
	s, err := Snapshot([]int{pb, pi})
	if err != nil {
		t.Fatal(err)
	}
	t0, err := cpuTicks(pb)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		t1, err := cpuTicks(pb)
		if err != nil {
			t.Fatal(err)
		}
		if t1-t0 >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("busy process used %d ticks in 20s", t1-t0)
		}
		time.Sleep(10 * time.Millisecond)
	}
	u, err := s.Since(100)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.CPUByPID) != 2 || u.CPUByPID[pb] < 0.05 || u.CPUByPID[pi] > 0.02 {
		t.Fatalf("CPUByPID = %v, want busy %d >= 0.05 s and idle %d ~0", u.CPUByPID, pb, pi)
	}
	if sum := u.CPUByPID[pb] + u.CPUByPID[pi]; math.Abs(sum-u.CPUSeconds) > 1e-9 {
		t.Fatalf("shares add up to %v, CPUSeconds %v", sum, u.CPUSeconds)
	}
}
