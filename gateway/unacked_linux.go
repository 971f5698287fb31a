//go:build linux

package gateway

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unacknowledged reports whether the peer of c has not acknowledged bytes
// sent to it (TCP_INFO's tcpi_unacked: segments sent and not yet
// acknowledged). A request that is still unacknowledged when the backend's
// first response byte is overdue never reached the replica's kernel whole:
// the host is cut off or down, and the replica cannot be generating it.
// false when c is not a TCP socket or the kernel does not say.
func unacknowledged(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var unacked uint32
	if err := raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			unacked = info.Unacked
		}
	}); err != nil {
		return false
	}
	return unacked > 0
}
