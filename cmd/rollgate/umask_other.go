//go:build !unix

package main

// privateFiles is a no-op where there is no umask.
func privateFiles() {}
