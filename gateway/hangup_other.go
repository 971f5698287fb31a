//go:build !unix || aix

package gateway

import (
	"errors"
	"syscall"
)

// peekSupported: without MSG_PEEK|MSG_DONTWAIT, client connections are not
// watched.
const peekSupported = false

// waitHangup is never called where peeking is not supported.
func waitHangup(syscall.RawConn) (bool, error) {
	return false, errors.ErrUnsupported
}

// peerClosed cannot tell where peeking is not supported.
func peerClosed(syscall.RawConn) bool { return false }

// waitReadable is never called where peeking is not supported.
func waitReadable(syscall.RawConn) error { return errors.ErrUnsupported }
