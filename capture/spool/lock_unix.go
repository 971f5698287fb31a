//go:build unix

package spool

import (
	"os"
	"syscall"
)

// lockDir takes an exclusive advisory lock on path (created if missing); the
// kernel releases it when the process dies.
func lockDir(path string) (*os.File, error) {
	f, err := OpenFile(path, os.O_CREATE|os.O_RDWR, FileMode)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func unlockDir(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}
