package gateway

import (
	"errors"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestDialTimeoutRetryable: a call whose dial timed out never reached the
// replica (its host cut off: SYNs dropped), so it is retried on another
// one; a timeout once connected is not (the engine may be generating).
// Before the fix a dial timeout was not retried: the client got a 504 after
// --connect-timeout although other replicas were up (drill c,
// cmd/rollgate/netns_drill_cd_e2e_test.go).
func TestDialTimeoutRetryable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, dialErr := fasthttp.DialTimeout(ln.Addr().String(), 1) // 1 ns: times out before connecting
	if !errors.Is(dialErr, fasthttp.ErrDialTimeout) {
		t.Fatalf("dialing with a 1 ns timeout gave %v, want a dial timeout", dialErr)
	}
	if !retryable(dialErr) {
		t.Errorf("retryable(%q) = false, want true: the request never left", dialErr)
	}
	for _, err := range []error{fasthttp.ErrTimeout, &net.OpError{Op: "read", Err: timeoutErr{}}} {
		if retryable(err) {
			t.Errorf("retryable(%q) = true, want false: the engine may be generating", err)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
