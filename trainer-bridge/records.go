package bridge

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
)

// recordFile is a private temporary file of length-prefixed records,
// written in order, then read in order (after rewind), as often as needed;
// close removes it. Build keeps on disk what would otherwise grow with the
// size of an export: the selection, the spilled samples, sorted runs.
type recordFile struct {
	what string // for errors: "sample spill", "selection", ...
	f    *os.File
	w    *bufio.Writer
	r    *bufio.Reader
	size int   // buffer size
	n    int64 // bytes of records written
	off  int64 // bytes written, with the length prefixes
	rec  []byte
}

// newRecordFile creates one in dir (os.TempDir when empty), with buffers
// of size bytes.
func newRecordFile(dir, what string, size int) (*recordFile, error) {
	f, err := os.CreateTemp(dir, "rollgate-bridge-spill-*")
	if err != nil {
		return nil, fmt.Errorf("bridge: creating a temporary file for the %s (point --spill-dir or TMPDIR at a folder with room): %w", what, err)
	}
	return &recordFile{what: what, f: f, w: bufio.NewWriterSize(f, size), size: size}, nil
}

// append writes one record.
func (f *recordFile) append(rec []byte) error {
	var head [binary.MaxVarintLen64]byte
	h := binary.PutUvarint(head[:], uint64(len(rec)))
	if _, err := f.w.Write(head[:h]); err != nil {
		return f.writeErr(err)
	}
	if _, err := f.w.Write(rec); err != nil {
		return f.writeErr(err)
	}
	f.n += int64(len(rec))
	f.off += int64(h + len(rec))
	return nil
}

func (f *recordFile) writeErr(err error) error {
	return fmt.Errorf("bridge: writing the %s %s (%d bytes so far; free disk space or point --spill-dir or TMPDIR elsewhere): %w", f.what, f.f.Name(), f.n, err)
}

// rewind flushes what was written and starts reading from the first record.
func (f *recordFile) rewind() error {
	if err := f.w.Flush(); err != nil {
		return f.writeErr(err)
	}
	if _, err := f.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("bridge: rewinding the %s: %w", f.what, err)
	}
	if f.r == nil {
		f.r = bufio.NewReaderSize(f.f, f.size)
	} else {
		f.r.Reset(f.f)
	}
	return nil
}

// next returns the next record, valid until the following call; io.EOF
// after the last one.
func (f *recordFile) next() (b []byte, err error) {
	b, f.rec, err = readRecord(f.r, f.rec, f.n)
	if err != nil && err != io.EOF {
		err = f.readErr(err)
	}
	return b, err
}

func (f *recordFile) readErr(err error) error {
	return fmt.Errorf("bridge: reading the %s: %w", f.what, err)
}

// readRecord reads one length-prefixed record of at most max bytes into
// buf (grown as needed, and returned for reuse); io.EOF at a clean end.
func readRecord(r *bufio.Reader, buf []byte, max int64) (rec, grown []byte, err error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, buf, err
	}
	if n > uint64(max) {
		return nil, buf, errSpillCorrupt
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	rec = buf[:n]
	if _, err := io.ReadFull(r, rec); err != nil {
		return nil, buf, io.ErrUnexpectedEOF
	}
	return rec, buf, nil
}

// close removes the file.
func (f *recordFile) close() {
	f.f.Close()
	os.Remove(f.f.Name())
}

// recordEncoder appends the fields of a record.
type recordEncoder []byte

func (e *recordEncoder) uvarint(v uint64) { *e = binary.AppendUvarint(*e, v) }

func (e *recordEncoder) string(v string) {
	e.uvarint(uint64(len(v)))
	*e = append(*e, v...)
}

func (e *recordEncoder) float64(v float64) {
	*e = binary.LittleEndian.AppendUint64(*e, math.Float64bits(v))
}
