package hf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadFileRefusesNonRegularAndHuge: a tokenizer.json linked to
// /dev/zero (which drove RSS to 3 GB through the bridge API), a FIFO (whose
// open would block), a folder and a sparse file one byte over the cap are
// refused before any read, with an error naming the path and the reason; a
// regular file and a symlink to one (Hugging Face's cache layout) are read.
func TestReadFileRefusesNonRegularAndHuge(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "blob")
	if err := os.WriteFile(regular, []byte(`{"model":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(dir, "tokenizer.json")
	if err := os.Symlink(regular, linked); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.json")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.json")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileBytes + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	atCap := filepath.Join(dir, "cap.json")
	if err := os.WriteFile(atCap, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(atCap, MaxFileBytes); err != nil {
		t.Fatal(err)
	}

	for _, p := range []string{regular, linked} {
		if b, err := ReadFile(p); err != nil || string(b) != `{"model":{}}` {
			t.Errorf("ReadFile(%s) = %q, %v", p, b, err)
		}
	}
	if b, err := ReadFile(atCap); err != nil || len(b) != MaxFileBytes {
		t.Errorf("a file of exactly MaxFileBytes: %d bytes, %v", len(b), err)
	}
	f2 := func(path, want string) {
		t.Helper()
		b, err := ReadFile(path)
		if !errors.Is(err, ErrFileRefused) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), want) || b != nil {
			t.Errorf("ReadFile(%s) = %d bytes, %v; want ErrFileRefused naming the path and %q", path, len(b), err, want)
		}
	}
	f2(zero, "not a regular file but a device")
	f2(fifo, "not a regular file but a named pipe")
	f2(dir, "not a regular file but a folder")
	f2(huge, "is 67108865 bytes, over the 67108864-byte limit")
	if _, err := ReadFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	// LoadFile goes through it.
	if _, err := LoadFile(zero); !errors.Is(err, ErrFileRefused) {
		t.Errorf("LoadFile of a link to /dev/zero: %v", err)
	}
}
