//go:build unix

package spool

import (
	"fmt"
	"os"
	"syscall"
)

const oNoFollow = syscall.O_NOFOLLOW

// checkOwner refuses a folder this process's user does not own.
func checkOwner(dir string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("%s is %w (uid %d; this process runs as uid %d): another user could read or replace the spool; chown it to uid %d or choose another --spool-dir",
			dir, errNotOwner, st.Uid, uid, uid)
	}
	return nil
}
