package spool

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/rollgate/rollgate/export"
)

// segmentMagic starts every segment file; its last byte is the format version.
const segmentMagic = "RGSPOOL1"

const (
	magicLen   = int64(len(segmentMagic))
	segSuffix  = ".seg"
	ackName    = "ack"
	ackTmpName = "ack.tmp"
	lockName   = "LOCK"
	ackLen     = 20
)

// segment is one segment file: id (its name), size (end of its last valid
// record) and how many of its records are not yet acknowledged.
type segment struct {
	id      uint64
	size    int64
	records int
}

// position names one record: segment id, offset, and length (once read).
type position struct {
	seg uint64
	off int64
	n   int64
}

// dirState is the spool directory. Every method except read is called with
// the Spool's mu held; read is used by the replayer alone.
type dirState struct {
	path     string
	segBytes int64
	log      *slog.Logger
	lock     *os.File

	segs    []segment // oldest first; the last is the one being written when w != nil
	headOff int64     // offset of the next unacknowledged record in segs[0]
	records int       // unacknowledged records
	bytes   int64     // their total size
	nextID  uint64
	w       *os.File // segment being appended to
	dirty   bool     // w has writes not yet fsynced
	closed  bool

	r   *os.File // replayer's read handle
	rID uint64
}

func (d *dirState) segPath(id uint64) string {
	return filepath.Join(d.path, fmt.Sprintf("%020d%s", id, segSuffix))
}

// openDir locks dir and recovers its segments: acknowledged ones are
// deleted, torn or corrupt tails truncated (onCorrupt is called once per
// discarded record or segment), and the rest counted for replay.
func openDir(dir string, segBytes int64, onCorrupt func(), log *slog.Logger) (*dirState, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("spool: create directory: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("spool: %s is in use by another process (one spool directory per gateway): %w", dir, err)
	}
	d := &dirState{path: dir, segBytes: segBytes, log: log, lock: lock, nextID: 1}
	if err := d.recover(onCorrupt); err != nil {
		d.unlock()
		return nil, err
	}
	return d, nil
}

func (d *dirState) recover(onCorrupt func()) error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("spool: read directory: %w", err)
	}
	var ids []uint64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), segSuffix)
		if !ok || e.IsDir() {
			continue
		}
		id, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			d.log.Warn("spool: ignoring a file that is not a segment", "file", e.Name())
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ackID, ackOff, ackOK := d.readAck()
	if len(ids) > 0 {
		d.nextID = ids[len(ids)-1] + 1
	}
	if ackOK && ackID >= d.nextID {
		d.nextID = ackID + 1
	}
	for _, id := range ids {
		if ackOK && id < ackID {
			if err := os.Remove(d.segPath(id)); err != nil {
				return fmt.Errorf("spool: remove acknowledged segment: %w", err)
			}
			continue
		}
		start := magicLen
		if ackOK && id == ackID {
			start = max(ackOff, magicLen)
		}
		seg, err := d.scan(id, start, onCorrupt)
		if err != nil {
			return err
		}
		if seg.records == 0 {
			if err := os.Remove(d.segPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("spool: remove empty segment: %w", err)
			}
			continue
		}
		if len(d.segs) == 0 {
			d.headOff = start
		}
		d.segs = append(d.segs, seg)
		d.records += seg.records
		d.bytes += seg.size - start
	}
	if d.records == 0 {
		return d.reset()
	}
	return nil
}

// scan validates segment id from offset start, truncates it after its last
// valid record, and returns its unacknowledged records.
func (d *dirState) scan(id uint64, start int64, onCorrupt func()) (segment, error) {
	path := d.segPath(id)
	seg := segment{id: id}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return seg, fmt.Errorf("spool: open segment: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return seg, fmt.Errorf("spool: stat segment: %w", err)
	}
	size := info.Size()
	var magic [len(segmentMagic)]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil || string(magic[:]) != segmentMagic {
		if size > 0 {
			onCorrupt()
			d.log.Error("spool: segment has no valid header; moved aside", "file", path, "size", size)
			if err := os.Rename(path, path+".corrupt"); err != nil {
				return seg, fmt.Errorf("spool: move corrupt segment aside: %w", err)
			}
		}
		return seg, nil // an empty file (crash right after creating it) is removed by the caller
	}
	if start > size {
		d.log.Warn("spool: acknowledged offset beyond the segment's end; nothing left to replay in it", "file", path, "offset", start, "size", size)
		start = size
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return seg, fmt.Errorf("spool: seek segment: %w", err)
	}
	br := bufio.NewReaderSize(f, 1<<20)
	off := start
	var buf []byte
	var bad error
	for off < size {
		var hdr [recordHeaderSize]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			bad = ErrShortRecord
			break
		}
		n, err := recordLen(hdr[:])
		if err != nil {
			bad = err
			break
		}
		if off+int64(n) > size {
			bad = ErrShortRecord
			break
		}
		buf = append(buf[:0], hdr[:]...)
		buf = slices.Grow(buf, n)[:n]
		if _, err := io.ReadFull(br, buf[recordHeaderSize:]); err != nil {
			bad = fmt.Errorf("spool: read segment: %w", err)
			break
		}
		if err := checkRecord(buf); err != nil {
			bad = err
			break
		}
		off += int64(n)
		seg.records++
	}
	if bad != nil {
		onCorrupt()
		d.log.Error("spool: torn or corrupt record; truncating the segment there", "file", path,
			"offset", off, "discarded_bytes", size-off, "err", bad)
		if err := f.Truncate(off); err != nil {
			return seg, fmt.Errorf("spool: truncate segment: %w", err)
		}
		if err := f.Sync(); err != nil {
			return seg, fmt.Errorf("spool: sync segment: %w", err)
		}
	}
	seg.size = off
	return seg, nil
}

// head is the position of the oldest unacknowledged record; records > 0.
func (d *dirState) head() position { return position{seg: d.segs[0].id, off: d.headOff} }

// append writes one framed record to the current segment, starting a new
// one when it is full, and fsyncs it when sync is set.
func (d *dirState) append(rec []byte, sync bool) error {
	if d.closed {
		return ErrClosed
	}
	if d.w == nil || d.segs[len(d.segs)-1].size >= d.segBytes {
		if err := d.roll(); err != nil {
			return err
		}
	}
	last := &d.segs[len(d.segs)-1]
	n, err := d.w.Write(rec)
	if err == nil && sync {
		err = d.w.Sync()
	}
	if err != nil {
		if n > 0 {
			_ = d.w.Truncate(last.size) // O_APPEND: the next write goes to the new end
		}
		return fmt.Errorf("write segment %s: %w (check free space on the spool's disk)", d.segPath(last.id), err)
	}
	d.dirty = !sync
	last.size += int64(n)
	last.records++
	d.records++
	d.bytes += int64(n)
	return nil
}

// roll closes the current segment (fsynced) and starts a new one.
func (d *dirState) roll() error {
	if d.w != nil {
		if err := d.closeWriter(); err != nil {
			return err
		}
	}
	id := d.nextID
	path := d.segPath(id)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	if _, err := f.WriteString(segmentMagic); err != nil {
		f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("write segment %s: %w", path, err)
	}
	d.nextID++
	if err := syncDir(d.path); err != nil {
		d.log.Warn("spool: fsync of the directory failed", "err", err)
	}
	d.segs = append(d.segs, segment{id: id, size: magicLen})
	if len(d.segs) == 1 {
		d.headOff = magicLen
	}
	d.w = f
	return nil
}

func (d *dirState) closeWriter() error {
	err := d.w.Sync()
	if cerr := d.w.Close(); err == nil {
		err = cerr
	}
	d.w, d.dirty = nil, false
	if err != nil {
		return fmt.Errorf("close segment: %w", err)
	}
	return nil
}

// read reads and decodes the record at pos (called by the replayer only).
func (d *dirState) read(pos position) (*export.Batch, int64, error) {
	if d.r == nil || d.rID != pos.seg {
		if d.r != nil {
			d.r.Close()
			d.r = nil
		}
		f, err := os.Open(d.segPath(pos.seg))
		if err != nil {
			return nil, 0, fmt.Errorf("open segment: %w", err)
		}
		d.r, d.rID = f, pos.seg
	}
	var hdr [recordHeaderSize]byte
	if _, err := d.r.ReadAt(hdr[:], pos.off); err != nil {
		return nil, 0, fmt.Errorf("read segment: %w", err)
	}
	n, err := recordLen(hdr[:])
	if err != nil {
		return nil, 0, err
	}
	buf := make([]byte, n)
	if _, err := d.r.ReadAt(buf, pos.off); err != nil {
		return nil, 0, fmt.Errorf("read segment: %w", err)
	}
	b, _, err := DecodeRecord(buf)
	if err != nil {
		return nil, 0, err
	}
	return b, int64(n), nil
}

// ack marks the record at pos (the head) as stored by the sink.
func (d *dirState) ack(pos position) error {
	seg := &d.segs[0]
	if seg.id != pos.seg || d.headOff != pos.off {
		return fmt.Errorf("spool: ack of %d@%d but the head is %d@%d", pos.seg, pos.off, seg.id, d.headOff)
	}
	d.headOff += pos.n
	seg.records--
	d.records--
	d.bytes -= pos.n
	if d.records == 0 {
		return d.reset()
	}
	if seg.records == 0 {
		return d.popHead()
	}
	return d.writeAck(seg.id, d.headOff)
}

// skipSegment drops the unacknowledged records of the head segment id (its
// rest could not be read).
func (d *dirState) skipSegment(id uint64) {
	if len(d.segs) == 0 || d.segs[0].id != id {
		return
	}
	seg := d.segs[0]
	d.records -= seg.records
	d.bytes -= seg.size - d.headOff
	if d.records == 0 {
		_ = d.reset()
		return
	}
	_ = d.popHead()
}

// popHead deletes the head segment; it is not the one being written.
func (d *dirState) popHead() error {
	if len(d.segs) == 1 && d.w != nil {
		if err := d.closeWriter(); err != nil {
			return err
		}
	}
	id := d.segs[0].id
	d.segs = d.segs[1:]
	d.headOff = magicLen
	if err := os.Remove(d.segPath(id)); err != nil {
		return fmt.Errorf("remove segment: %w", err)
	}
	return nil
}

// reset deletes every segment and the ack file once nothing is left.
func (d *dirState) reset() error {
	var errs []error
	if d.w != nil {
		if err := d.closeWriter(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range d.segs {
		if err := os.Remove(d.segPath(s.id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove segment: %w", err))
		}
	}
	d.segs, d.headOff, d.records, d.bytes = d.segs[:0], 0, 0, 0
	if err := os.Remove(filepath.Join(d.path, ackName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove ack file: %w", err))
	}
	return errors.Join(errs...)
}

// writeAck records the head position: written to a temporary file and
// renamed, so a crash leaves the old or the new position. It is not
// fsynced: losing it only replays acknowledged batches again.
func (d *dirState) writeAck(id uint64, off int64) error {
	var b [ackLen]byte
	binary.LittleEndian.PutUint64(b[0:], id)
	binary.LittleEndian.PutUint64(b[8:], uint64(off))
	binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
	tmp := filepath.Join(d.path, ackTmpName)
	if err := os.WriteFile(tmp, b[:], 0o644); err != nil {
		return fmt.Errorf("write ack file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(d.path, ackName)); err != nil {
		return fmt.Errorf("write ack file: %w", err)
	}
	return nil
}

func (d *dirState) readAck() (id uint64, off int64, ok bool) {
	b, err := os.ReadFile(filepath.Join(d.path, ackName))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("spool: unreadable ack file; replaying from the oldest segment's start", "err", err)
		}
		return 0, 0, false
	}
	if len(b) != ackLen || crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:]) {
		d.log.Warn("spool: invalid ack file; replaying from the oldest segment's start (some batches may be sent twice)")
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(b), int64(binary.LittleEndian.Uint64(b[8:])), true
}

// sync fsyncs the current segment if it has unsynced writes.
func (d *dirState) sync() error {
	if d.w == nil || !d.dirty {
		return nil
	}
	if err := d.w.Sync(); err != nil {
		return fmt.Errorf("fsync segment: %w", err)
	}
	d.dirty = false
	return nil
}

// close fsyncs and closes the files and releases the directory lock.
func (d *dirState) close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	var err error
	if d.w != nil {
		err = d.closeWriter()
	}
	if d.r != nil {
		d.r.Close()
		d.r = nil
	}
	d.unlock()
	return err
}

func (d *dirState) unlock() {
	if d.lock != nil {
		unlockDir(d.lock)
		d.lock = nil
	}
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
