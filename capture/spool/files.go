package spool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Modes of what the spool and capture's write-ahead log create: captured
// calls are readable by the gateway's user alone.
const (
	DirMode  os.FileMode = 0o700
	FileMode os.FileMode = 0o600
)

// CheckDir creates dir (DirMode) if it is missing and refuses, with an error
// naming the folder and the fix, a folder another user owns, one that group
// or others may write (they could plant links or read the spool through
// files they create), or one holding a symbolic link: nothing in a spool
// folder is ever reached through a link.
func CheckDir(dir string) error {
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return fmt.Errorf("create %s (check --spool-dir): %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat %s (check --spool-dir): %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a folder (check --spool-dir)", dir)
	}
	if err := checkOwner(dir, fi); err != nil {
		return err
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %04o); the spool keeps captured calls: run chmod go-w %s (or chmod 700), or choose another --spool-dir",
			dir, fi.Mode().Perm(), dir)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s (check --spool-dir): %w", dir, err)
	}
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			p := filepath.Join(dir, e.Name())
			return fmt.Errorf("%s is a symbolic link; rollgate never follows links inside its spool folder: remove it (rm %s) and check who can write to %s", p, p, dir)
		}
	}
	return nil
}

// OpenFile is os.OpenFile that never follows a symbolic link at path (an
// error instead), for every file in a spool folder.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|oNoFollow, perm)
	if err != nil && isLinkErr(path) {
		return nil, fmt.Errorf("%s is a symbolic link; rollgate never follows links inside its spool folder: remove it: %w", path, err)
	}
	return f, err
}

// isLinkErr tells whether path is a symbolic link (why an O_NOFOLLOW open failed).
func isLinkErr(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSymlink != 0
}

// ReadFile is os.ReadFile through OpenFile: a link is an error, not followed.
func ReadFile(path string) ([]byte, error) {
	f, err := OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// WriteFile is os.WriteFile (mode FileMode) through OpenFile: a link at path
// is an error, not followed nor truncated.
func WriteFile(path string, b []byte) error {
	f, err := OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, FileMode)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Quarantine copies the bytes [off, end) of r to path (mode FileMode,
// replaced if present), so that a damaged record is kept aside for
// inspection while the rest of its file is used.
func Quarantine(path string, r io.ReaderAt, off, end int64) error {
	f, err := OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, FileMode)
	if err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	_, err = io.Copy(f, io.NewSectionReader(r, off, end-off))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("quarantine %s: %w", path, err)
	}
	return nil
}

// QuarantineName is the name of the file keeping the damaged bytes found at
// off in file: "<file>.<off>.quarantine", beside it.
func QuarantineName(file string, off int64) string {
	return fmt.Sprintf("%s.%d.quarantine", file, off)
}

var errNotOwner = errors.New("owned by another user")
