//go:build !unix || aix

package mock

import "syscall"

// peekSupported: without MSG_PEEK|MSG_DONTWAIT, client disconnects go unnoticed until
// the answer is written.
const peekSupported = false

func peerClosed(syscall.RawConn) bool { return false }
