//go:build !unix

package spool

import "os"

// lockDir opens path; without flock, nothing keeps a second process out.
func lockDir(path string) (*os.File, error) {
	return OpenFile(path, os.O_CREATE|os.O_RDWR, FileMode)
}

func unlockDir(f *os.File) { f.Close() }
