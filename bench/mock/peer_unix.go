//go:build unix && !aix

package mock

import "syscall"

const peekSupported = true

// peerClosed waits until the peer of raw closes or resets the connection (true), or
// sends a byte or the read deadline passes (false). It peeks without consuming.
func peerClosed(raw syscall.RawConn) bool {
	var (
		b      [1]byte
		closed bool
	)
	_ = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		for err == syscall.EINTR {
			n, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		}
		if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK {
			return false // wait until readable
		}
		closed = err != nil || n == 0
		return true
	})
	return closed
}
