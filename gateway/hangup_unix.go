//go:build unix && !aix

package gateway

import (
	"errors"
	"syscall"
)

// peekSupported: this platform has MSG_PEEK|MSG_DONTWAIT (AIX lacks MSG_DONTWAIT).
const peekSupported = true

// waitHangup blocks until the peer of raw closes or resets the connection
// (true), the peer sends bytes (false: undecidable without consuming them),
// or the read deadline or a local close ends the wait (false, the error).
// It consumes nothing: the runtime's poller waits for readability and a
// non-blocking MSG_PEEK looks at what arrived.
func waitHangup(raw syscall.RawConn) (bool, error) {
	var (
		buf  [1]byte
		gone bool
	)
	err := raw.Read(func(fd uintptr) bool {
		for {
			n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK):
				return false // nothing yet: wait for readability
			case err != nil: // ECONNRESET, ETIMEDOUT...: the client is gone
				gone = true
			case n == 0: // EOF: the client closed its side
				gone = true
			}
			return true
		}
	})
	return gone, err
}
