//go:build !race

// The race detector makes sync.Pool drop items at random, so allocation
// counts are only meaningful without it.

package capture

import "testing"

// TestLetGoLosesNoBuffer: scanners that take pooled buffers (Feed) and lend
// them back (LetGo) in an order of their own, as streams resumed on
// different goroutines do, allocate none once the pool holds one set per
// scanner. (When LetGo took a holder from the pool for its buffers, it
// could take one full of another scanner's, which were then lost, and Feed
// could take an empty holder while full ones waited: every Feed but the
// first allocated.)
func TestLetGoLosesNoBuffer(t *testing.T) {
	ev := []byte(`data: {"choices":[{"delta":{"content":" token"}}]}` + "\n\n")
	scanners := make([]SSEScanner, 8)
	run := func() {
		for i := range scanners {
			scanners[i].Feed(ev)
			for {
				if _, ok := scanners[i].Next(); !ok {
					break
				}
			}
		}
		for i := range scanners {
			scanners[i].LetGo()
		}
	}
	run() // the first Feeds grow the buffers the pool then holds
	if a := testing.AllocsPerRun(200, run); a >= 1 {
		t.Fatalf("%.0f allocations per round of %d streams taking and lending back pooled buffers, want 0", a, len(scanners))
	}
}
