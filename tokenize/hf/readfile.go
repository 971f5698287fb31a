package hf

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// MaxFileBytes is the largest tokenizer file ReadFile reads (64 MiB): far
// above the biggest tokenizer.json of a released model (about 35 MB), far
// below what would hurt the process.
const MaxFileBytes = 64 << 20

// ErrFileRefused is wrapped by ReadFile's errors for a file it will not
// read: not a regular file (a device such as /dev/zero, a FIFO, a folder),
// or larger than MaxFileBytes.
var ErrFileRefused = errors.New("hf: tokenizer file refused")

// ReadFile reads a tokenizer file (tokenizer.json, tokenizer_config.json,
// a chat template) with a bound: it follows symlinks (Hugging Face's cache
// links every file of a snapshot to a blob) but refuses anything that is not
// a regular file, and any file over MaxFileBytes, before reading it; a file
// that grows past the cap while it is read is refused too. Every tokenizer
// file rollgate reads goes through it.
func ReadFile(path string) ([]byte, error) {
	// Stat before opening: opening a FIFO for reading would block until a
	// writer comes.
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := checkFile(path, st); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Again on what was opened: the path may have been swapped meanwhile.
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := checkFile(path, st); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %s grew past %d bytes (MaxFileBytes) while read", ErrFileRefused, path, MaxFileBytes)
	}
	return data, nil
}

// checkFile refuses what ReadFile does not read.
func checkFile(path string, st fs.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file but %s; point at the model folder's own files", ErrFileRefused, path, fileKind(st.Mode()))
	}
	if st.Size() > MaxFileBytes {
		return fmt.Errorf("%w: %s is %d bytes, over the %d-byte limit of tokenizer files (MaxFileBytes)", ErrFileRefused, path, st.Size(), MaxFileBytes)
	}
	return nil
}

// fileKind names what a non-regular file is, for errors.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file (" + m.Type().String() + ")"
}
