//go:build unix

package main

import "syscall"

// privateFiles makes every file and folder serve creates from here on,
// its own and its libraries' (SQLite's store file and its -wal and -shm,
// spool and WAL files, bridge batches), readable by its user alone: 0600
// and 0700. Captured calls hold prompts and answers.
func privateFiles() { syscall.Umask(0o077) }
