package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer safe for a child process's output
// goroutine and the test's reads at once (a process's Stdout and Stderr).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
