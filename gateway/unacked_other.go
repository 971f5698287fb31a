//go:build !linux

package gateway

import "net"

// unacknowledged cannot tell without Linux's TCP_INFO: a first-byte
// timeout stays a timeout (not retried).
func unacknowledged(net.Conn) bool { return false }
