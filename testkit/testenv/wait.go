package testenv

import (
	"testing"
	"time"
)

// WaitFor waits until cond holds, checking it every millisecond at first
// and then less often (up to every 50 ms), and fails the test with what()
// when timeout passes first. It is the one place tests poll a condition
// they cannot be told about (a counter, a row count, a process's state): the
// waits are on the condition, never on a guess of how long it takes.
func WaitFor(t testing.TB, timeout time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting: %s", timeout, what())
		}
		time.Sleep(interval) // polling interval of this wait on cond
		interval = min(2*interval, 50*time.Millisecond)
	}
}
