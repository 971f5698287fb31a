package load

import (
	"math"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestCPUByPID: a run's CPU is split by the pids given to Snapshot, so a
// gateway and its engine can be measured apart in one run: a busy process
// tree's share grows (its work done by a grandchild, as vLLM's EngineCore
// under the API server under a launcher), an idle one's stays near zero,
// and the shares add up.
func TestCPUByPID(t *testing.T) {
	busy := exec.Command("sh", "-c", `sh -c "sh -c 'while :; do :; done'" & wait`)
	idle := exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{busy, idle} {
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a group of its own, killed whole
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL); _ = c.Wait() })
	}
	pb, pi := busy.Process.Pid, idle.Process.Pid
	var tree []int
	for deadline := time.Now().Add(20 * time.Second); len(tree) < 3; tree = descendants(pb) {
		if time.Now().After(deadline) {
			t.Fatalf("process tree under %d: %v, want 3 levels", pb, tree)
		}
		time.Sleep(10 * time.Millisecond)
	}
	leaf := tree[len(tree)-1]
	s, err := Snapshot([]int{pb, pi, leaf}) // leaf twice: counted once, under pb
	if err != nil {
		t.Fatal(err)
	}
	t0, err := cpuTicks(leaf)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		t1, err := cpuTicks(leaf)
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
