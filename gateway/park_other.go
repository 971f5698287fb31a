//go:build !linux

package gateway

import (
	"errors"
	"syscall"
	"time"
)

// parkSupported: streams wait for their engine on their own goroutines
// here (the parker is Linux's epoll; see park_linux.go).
const parkSupported = false

// parkWorkers: no parker, no workers.
const parkWorkers = 0

// parker is never made on this platform.
type parker struct{}

func streamParker() (*parker, error) {
	return nil, errors.New("stream parker: not supported on this platform (streams wait on their own goroutines)")
}

func (*parker) park(*streamBody, syscall.RawConn, time.Time) bool { return false }

func (*parker) expire(*streamBody) bool { return false }

func (*parker) stopTimer(*streamBody) {}

func (*parker) dispatch(*streamBody) {}

func (*parker) enterWrite() {}

func (*parker) leaveWrite() {}

func (*parker) retire() {}

func (*parker) writersBlocked() int { return 0 }
