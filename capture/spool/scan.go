package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// RecordFrame describes the records ScanRecords looks for: a header of the
// payload length and the CRC-32C of the payload (uint32 little endian each),
// then the payload. The spool's segments and capture's write-ahead log share
// this framing.
type RecordFrame struct {
	// MaxPayload bounds a payload; a header claiming more is corrupt.
	MaxPayload uint32
	// FirstByte, when set, tells whether a payload may start with b (its
	// format version): a cheap filter for the offsets tried while
	// resynchronising after a bad record.
	FirstByte func(b byte) bool
}

// ScanRecords walks the records of r from start to size. valid is called
// with the offset and full length (header included) of every record whose
// length and CRC hold; bad once per damaged region with its offsets
// [off, end) and why: a bad length, a bad CRC, a record cut short. After a
// bad record, the scan resynchronises on the earliest later offset holding a
// valid record (length in range, payload's first byte plausible, CRC), so
// one damaged record never hides the records after it. A read error of r
// ends the scan and is returned. Memory is bounded by a 64 KiB window,
// whatever the records' sizes.
func ScanRecords(r io.ReaderAt, start, size int64, f RecordFrame, valid func(off, n int64), bad func(off, end int64, err error)) error {
	s := scanner{r: r, size: size, f: f, buf: make([]byte, 64<<10)}
	off := start
	for off < size {
		n, err := s.recordAt(off)
		if err == nil {
			valid(off, n)
			off += n
			continue
		}
		var rerr readError
		if errors.As(err, &rerr) {
			return rerr.err
		}
		next, err2 := s.resync(off + 1)
		if err2 != nil {
			return err2
		}
		bad(off, next, err)
		off = next
	}
	return nil
}

// readError wraps a failed read of the scanned file (not a bad record).
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }

type scanner struct {
	r    io.ReaderAt
	size int64
	f    RecordFrame
	buf  []byte
}

// recordAt checks the record at off: its length and CRC, the payload
// streamed through buf.
func (s *scanner) recordAt(off int64) (int64, error) {
	var hdr [recordHeaderSize]byte
	if s.size-off < recordHeaderSize {
		return 0, fmt.Errorf("%w: %d bytes left for an %d-byte header", ErrShortRecord, s.size-off, recordHeaderSize)
	}
	if _, err := s.r.ReadAt(hdr[:], off); err != nil {
		return 0, readError{fmt.Errorf("read at %d: %w", off, err)}
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n == 0 || n > s.f.MaxPayload {
		return 0, fmt.Errorf("%w: payload length %d", ErrCorruptRecord, n)
	}
	if s.size-off-recordHeaderSize < int64(n) {
		return 0, fmt.Errorf("%w: payload of %d bytes, %d left", ErrShortRecord, n, s.size-off-recordHeaderSize)
	}
	crc := uint32(0)
	for p := int64(0); p < int64(n); {
		chunk := s.buf[:min(int64(len(s.buf)), int64(n)-p)]
		if _, err := s.r.ReadAt(chunk, off+recordHeaderSize+p); err != nil {
			return 0, readError{fmt.Errorf("read at %d: %w", off+recordHeaderSize+p, err)}
		}
		if p == 0 && s.f.FirstByte != nil && !s.f.FirstByte(chunk[0]) {
			return 0, fmt.Errorf("%w: payload starts with version byte %d", ErrCorruptRecord, chunk[0])
		}
		crc = crc32.Update(crc, castagnoli, chunk)
		p += int64(len(chunk))
	}
	if want := binary.LittleEndian.Uint32(hdr[4:]); crc != want {
		return 0, fmt.Errorf("%w: checksum %08x, header says %08x", ErrCorruptRecord, crc, want)
	}
	return recordHeaderSize + int64(n), nil
}

// resync returns the earliest offset from from on holding a valid record,
// or size when there is none.
func (s *scanner) resync(from int64) (int64, error) {
	win := make([]byte, 64<<10)
	for base := from; base+recordHeaderSize < s.size; {
		w := win[:min(int64(len(win)), s.size-base)]
		if _, err := s.r.ReadAt(w, base); err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("read at %d: %w", base, err)
		}
		// Offsets whose header and first payload byte lie in the window.
		last := len(w) - recordHeaderSize - 1
		for i := 0; i <= last; i++ {
			n := binary.LittleEndian.Uint32(w[i:])
			o := base + int64(i)
			if n == 0 || n > s.f.MaxPayload || s.size-o-recordHeaderSize < int64(n) {
				continue
			}
			if s.f.FirstByte != nil && !s.f.FirstByte(w[i+recordHeaderSize]) {
				continue
			}
			if _, err := s.recordAt(o); err == nil {
				return o, nil
			} else if rerr := (readError{}); errors.As(err, &rerr) {
				return 0, rerr.err
			}
		}
		if last < 0 {
			break
		}
		base += int64(last + 1)
	}
	return s.size, nil
}
