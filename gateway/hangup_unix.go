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

// peerClosed reports, without waiting and without consuming anything,
// whether the peer of raw has closed or reset the connection.
func peerClosed(raw syscall.RawConn) bool {
	var (
		buf  [1]byte
		gone bool
	)
	// Control, not Read: a read deadline that has passed must not hide it.
	raw.Control(func(fd uintptr) { //nolint:errcheck // an error leaves gone false: not known to be gone
		for {
			n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			gone = n == 0 && err == nil || err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
			return
		}
	})
	return gone
}

// waitReadable blocks until raw has bytes to read, or its peer closed or
// reset the connection (then a read returns at once), or the read deadline
// or a local close ends the wait (the error). It consumes nothing.
func waitReadable(raw syscall.RawConn) error {
	var buf [1]byte
	return raw.Read(func(fd uintptr) bool {
		for {
			_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK):
				return false // nothing yet: wait for readability
			}
			return true // bytes, EOF or an error: the next read tells
		}
	})
}
