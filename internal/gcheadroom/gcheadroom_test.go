package gcheadroom

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		scannable, headroom uint64
		base, want          int
	}{
		{10 * mib, 48 * mib, 100, 100}, // small heap: paced as before
		{48 * mib, 48 * mib, 100, 100},
		{96 * mib, 48 * mib, 100, 50},  // grows by the headroom
		{100 * mib, 48 * mib, 100, 48}, // rounded down: never more than the headroom
		{400 * mib, 48 * mib, 100, Floor},
		{96 * mib, 48 * mib, 40, 40},  // never above GOGC
		{96 * mib, 48 * mib, 10, 10},  // a GOGC below the floor stays
		{96 * mib, 48 * mib, -1, -1},  // GC off stays off
		{96 * mib, 0, 100, 100},       // no headroom: off
		{0, 48 * mib, 100, 100},       // nothing measured yet
		{96 * mib, 48 * mib, 300, 50}, // GOGC=300: capped the same
	} {
		if got := Percent(c.scannable, c.headroom, c.base); got != c.want {
			t.Errorf("Percent(%d MiB, %d MiB, %d) = %d, want %d", c.scannable/mib, c.headroom/mib, c.base, got, c.want)
		}
	}
}

// holdMiB allocates n MiB the caller keeps live (runtime.KeepAlive).
func holdMiB(n int) [][]byte {
	live := make([][]byte, n)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	return live
}

// waitPercent runs collections until the pacers have set want (each
// collection queues the sentinels' finalizers), or fails after 10 s.
func waitPercent(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for GCPercent() != want || gcPercent() != want {
		if time.Now().After(deadline) {
			t.Fatalf("GC percent: pacers %d, runtime %d; want %d", GCPercent(), gcPercent(), want)
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// A live heap far above the headroom lowers the GC percent after a
// collection; once it is freed the percent goes back to GOGC; Stop leaves
// GOGC as it found it.
func TestPacerFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	p := Start(4 << 20)
	defer p.Stop()
	if GCPercent() != 100 {
		t.Fatalf("before any collection the pacer holds %d, want GOGC 100", GCPercent())
	}
	live := holdMiB(64)
	// 64 MiB live and a 4 MiB headroom: 100 × 4 / 64 ≈ 6, so the floor.
	waitPercent(t, Floor)
	runtime.KeepAlive(live)
	live = nil
	waitPercent(t, 100)
	if p.Changes() < 2 {
		t.Errorf("the pacer changed the percent %d times, want at least 2", p.Changes())
	}

	live = holdMiB(64)
	waitPercent(t, Floor)
	p.Stop()
	if got := gcPercent(); got != 100 {
		t.Errorf("after Stop the GC percent is %d, want GOGC 100 back", got)
	}
	runtime.GC()
	runtime.GC()
	if got := gcPercent(); got != 100 {
		t.Errorf("a collection after Stop set the GC percent to %d, want 100 kept", got)
	}
	runtime.KeepAlive(live)
}

// Headroom 0 is off: the percent is never touched.
func TestPacerOff(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	p := Start(0)
	defer p.Stop()
	live := make([]byte, 32<<20)
	runtime.GC()
	runtime.GC()
	if got := gcPercent(); got != 100 || p.Changes() != 0 {
		t.Errorf("headroom 0: GC percent %d after %d changes, want 100 untouched", got, p.Changes())
	}
	runtime.KeepAlive(live)
}

// Two pacers at once (two gateways in one process), the second started
// while the first has lowered the percent: stopping the first leaves the
// second pacing from GOGC, not from what the first had set; the last one
// stopped restores GOGC.
func TestPacersShareThePercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	a := Start(4 << 20)
	defer a.Stop()
	live := holdMiB(64)
	waitPercent(t, Floor)
	b := Start(1 << 30)
	defer b.Stop()
	runtime.GC()
	if got := GCPercent(); got != Floor {
		t.Fatalf("with both running the percent is %d, want the smaller headroom's %d", got, Floor)
	}
	a.Stop()
	// b alone: 1 GiB of headroom over about 64 MiB, so GOGC again.
	waitPercent(t, 100)
	b.Stop()
	if got := gcPercent(); got != 100 {
		t.Errorf("after both stopped the GC percent is %d, want 100", got)
	}
	runtime.KeepAlive(live)
}
