package load

import (
	"fmt"
	"math"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
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
	testenv.WaitFor(t, 20*time.Second, func() string {
		return fmt.Sprintf("process tree under %d: %v, want 3 levels", pb, tree)
	}, func() bool { tree = descendants(pb); return len(tree) >= 3 })
	leaf := tree[len(tree)-1]
	s, err := Snapshot([]int{pb, pi, leaf}) // leaf twice: counted once, under pb
	if err != nil {
		t.Fatal(err)
	}
	t0, err := cpuTicks(leaf)
	if err != nil {
		t.Fatal(err)
	}
	var t1 uint64
	testenv.WaitFor(t, 20*time.Second, func() string {
		return fmt.Sprintf("busy process used %d ticks", t1-t0)
	}, func() bool {
		if t1, err = cpuTicks(leaf); err != nil {
			t.Fatal(err)
		}
		return t1-t0 >= 5
	})
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
