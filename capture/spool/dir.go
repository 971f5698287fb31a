package spool

import (
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
	groupName  = "group"
	groupTmp   = "group.tmp"
	groupLen   = 24
	lockName   = "LOCK"
	ackLen     = 20
)

// segment is one segment file: id (its name), size (end of its last valid
// record), how many of its records are not yet acknowledged, and the
// damaged regions found in it at open (skipped, their bytes quarantined).
type segment struct {
	id      uint64
	size    int64
	records int
	holes   []hole
}

// hole is a damaged region [off, end) of a segment, between valid records.
type hole struct{ off, end int64 }

// skipHoles returns off, or the end of the hole starting there.
func (s *segment) skipHoles(off int64) int64 {
	for _, h := range s.holes {
		if h.off == off {
			off = h.end
		}
	}
	return off
}

// live is the size of the records from off on (holes excluded).
func (s *segment) live(off int64) int64 {
	n := s.size - off
	for _, h := range s.holes {
		if h.off >= off {
			n -= h.end - h.off
		}
	}
	return n
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

// openDir checks (CheckDir) and locks dir and recovers its segments:
// acknowledged ones are deleted; a damaged region is copied to a quarantine
// file and skipped, the records after it kept (onCorrupt is called once per
// region with the rows it held when they can be told, else 0); a torn tail
// is truncated; the rest is counted for replay.
func openDir(dir string, segBytes int64, onCorrupt func(rows int), log *slog.Logger) (*dirState, error) {
	if err := CheckDir(dir); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
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

func (d *dirState) recover(onCorrupt func(rows int)) error {
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
			d.headOff = seg.skipHoles(start)
		}
		d.segs = append(d.segs, seg)
		d.records += seg.records
		d.bytes += seg.live(start)
	}
	if d.records == 0 {
		return d.reset()
	}
	return nil
}

// spoolFrame is how ScanRecords finds the spool's records.
var spoolFrame = RecordFrame{MaxPayload: MaxRecordBytes, FirstByte: func(b byte) bool { return b >= payloadVersionNoGroup && b <= payloadVersion }}

// scan validates segment id from offset start and returns its
// unacknowledged records. A damaged region between valid records (a bad
// header, checksum or length; a bad magic) is copied to a quarantine file
// beside the segment, counted and logged, and skipped: the records after
// it are kept. A damaged tail (a torn write) is quarantined and truncated.
func (d *dirState) scan(id uint64, start int64, onCorrupt func(rows int)) (segment, error) {
	path := d.segPath(id)
	seg := segment{id: id}
	f, err := OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return seg, fmt.Errorf("spool: open segment: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return seg, fmt.Errorf("spool: stat segment: %w", err)
	}
	size := info.Size()
	if size == 0 {
		return seg, nil // a crash right after creating it: removed by the caller
	}
	quarantine := func(off, end int64, why error) {
		q := QuarantineName(path, off)
		if err := Quarantine(q, f, off, end); err != nil {
			d.log.Error("spool: cannot keep a damaged region aside", "file", path, "offset", off, "err", err)
			q = ""
		}
		rows := damagedRows(f, off, end)
		onCorrupt(rows)
		d.log.Error("spool: damaged region skipped; the records after it are kept", "file", path,
			"offset", off, "bytes", end-off, "rows_lost", rows, "quarantine", q, "err", why)
	}
	var bad []hole
	var badWhy []error
	var magic [len(segmentMagic)]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != segmentMagic {
		bad, badWhy = append(bad, hole{0, min(size, magicLen)}), append(badWhy, errors.New("segment header is not "+segmentMagic))
	}
	if start > size {
		d.log.Warn("spool: acknowledged offset beyond the segment's end; nothing left to replay in it", "file", path, "offset", start, "size", size)
		start = size
	}
	end := max(start, magicLen)
	err = ScanRecords(f, max(start, magicLen), size, spoolFrame, func(off, n int64) {
		seg.records++
		end = off + n
	}, func(off, e int64, why error) {
		if len(bad) == 1 && bad[0].end == off { // the bad magic and what follows it: one region
			bad[0].end, badWhy[0] = e, fmt.Errorf("%w; %w", badWhy[0], why)
			return
		}
		bad, badWhy = append(bad, hole{off, e}), append(badWhy, why)
	})
	if err != nil {
		return seg, fmt.Errorf("spool: read segment %s: %w", path, err)
	}
	for i, h := range bad {
		quarantine(h.off, h.end, badWhy[i])
	}
	for _, h := range bad {
		if h.off = max(h.off, magicLen); h.off < h.end && h.off < end {
			seg.holes = append(seg.holes, h)
		}
	}
	if end < size { // a damaged tail: no record follows it
		if err := f.Truncate(end); err != nil {
			return seg, fmt.Errorf("spool: truncate segment: %w", err)
		}
		if err := f.Sync(); err != nil {
			return seg, fmt.Errorf("spool: sync segment: %w", err)
		}
	}
	seg.size = end
	return seg, nil
}

// damagedRows is how many rows the damaged region [off, end) of r held,
// when it is one record whose payload still decodes despite its checksum
// (a flipped byte in a string); else 0.
func damagedRows(r io.ReaderAt, off, end int64) int {
	if end-off <= recordHeaderSize || end-off > 64<<20 {
		return 0
	}
	buf := make([]byte, end-off)
	if _, err := r.ReadAt(buf, off); err != nil {
		return 0
	}
	if n, err := recordLen(buf); err != nil || int64(n) != end-off {
		return 0
	}
	b, err := DecodeBatch(buf[recordHeaderSize:])
	if err != nil {
		return 0
	}
	return b.Len()
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
	f, err := OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, FileMode)
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
// A record that cannot be decoded (its checksum held at open) returns an
// error wrapping ErrCorruptRecord and its length, so that it can be set
// aside (quarantineRecord) and the records after it replayed.
func (d *dirState) read(pos position) (*export.Batch, int64, error) {
	if d.r == nil || d.rID != pos.seg {
		if d.r != nil {
			d.r.Close()
			d.r = nil
		}
		f, err := OpenFile(d.segPath(pos.seg), os.O_RDONLY, 0)
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
		return nil, int64(n), err
	}
	return b, int64(n), nil
}

// quarantineRecord copies the record at pos (read failed to decode it) to a
// quarantine file beside its segment (called by the replayer only).
func (d *dirState) quarantineRecord(pos position) (string, error) {
	q := QuarantineName(d.segPath(pos.seg), pos.off)
	if d.r == nil || d.rID != pos.seg {
		return "", errors.New("segment not open")
	}
	return q, Quarantine(q, d.r, pos.off, pos.off+pos.n)
}

// ack marks the records ps (the head and the ones right after it, in
// order, in the head segment) as stored by the sink, and records the new
// head once: the ack file is rewritten (a create and a rename) once per
// replay write, not once per record, which cost 88% of the replayer's time
// against a free sink (BenchmarkReplay/merged: 165 µs a record, with the
// spool's lock held).
func (d *dirState) ack(ps ...position) error {
	seg := &d.segs[0]
	var err error
	for _, pos := range ps {
		if seg.id != pos.seg || d.headOff != pos.off {
			err = fmt.Errorf("spool: ack of %d@%d but the head is %d@%d", pos.seg, pos.off, seg.id, d.headOff)
			break
		}
		d.headOff = seg.skipHoles(d.headOff + pos.n)
		seg.records--
		d.records--
		d.bytes -= pos.n
	}
	switch {
	case d.records == 0:
		return errors.Join(err, d.reset())
	case seg.records == 0:
		return errors.Join(err, d.popHead())
	}
	return errors.Join(err, d.writeAck(seg.id, d.headOff))
}

// skipSegment drops the unacknowledged records of the head segment id (its
// rest could not be read).
func (d *dirState) skipSegment(id uint64) {
	if len(d.segs) == 0 || d.segs[0].id != id {
		return
	}
	seg := d.segs[0]
	d.records -= seg.records
	d.bytes -= seg.live(d.headOff)
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
	if len(d.segs) > 0 {
		d.headOff = d.segs[0].skipHoles(magicLen)
	}
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
	if err := os.Remove(filepath.Join(d.path, groupName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove group file: %w", err))
	}
	return errors.Join(errs...)
}

// writeGroup records, before a replay write that merges n records from
// pos on is first sent, which records it merges: a write the sink may have
// committed in part must be sent again exactly as it was, also after a
// restart (see Spool.replay). Written to a temporary file and renamed; not
// fsynced: it must outlive a killed process, and an OS crash loses the
// spool's unsynced tail anyway.
func (d *dirState) writeGroup(pos position, n int) error {
	var b [groupLen]byte
	binary.LittleEndian.PutUint64(b[0:], pos.seg)
	binary.LittleEndian.PutUint64(b[8:], uint64(pos.off))
	binary.LittleEndian.PutUint32(b[16:], uint32(n))
	return d.replaceFile(groupTmp, groupName, b[:], "group file")
}

// readGroup returns the last merged replay write recorded by writeGroup:
// its first record and how many it merged; ok false when there is none.
func (d *dirState) readGroup() (pos position, n int, ok bool) {
	b, err := ReadFile(filepath.Join(d.path, groupName))
	if err != nil || len(b) != groupLen || crc32.Checksum(b[:20], castagnoli) != binary.LittleEndian.Uint32(b[20:]) {
		return position{}, 0, false
	}
	return position{seg: binary.LittleEndian.Uint64(b), off: int64(binary.LittleEndian.Uint64(b[8:]))}, int(binary.LittleEndian.Uint32(b[16:])), true
}

// writeAck records the head position: written to a temporary file and
// renamed, so a crash leaves the old or the new position. It is not
// fsynced: losing it only replays acknowledged batches again.
func (d *dirState) writeAck(id uint64, off int64) error {
	var b [ackLen]byte
	binary.LittleEndian.PutUint64(b[0:], id)
	binary.LittleEndian.PutUint64(b[8:], uint64(off))
	return d.replaceFile(ackTmpName, ackName, b[:], "ack file")
}

// replaceFile writes b, whose last 4 bytes are set here to the CRC-32C of
// the rest, to the spool folder's file name through the temporary file tmp
// and a rename, so a crash leaves the old or the new content. It is not
// fsynced (writeAck and writeGroup say why that is enough).
func (d *dirState) replaceFile(tmp, name string, b []byte, what string) error {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	tmpPath := filepath.Join(d.path, tmp)
	if err := WriteFile(tmpPath, b); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	if err := os.Rename(tmpPath, filepath.Join(d.path, name)); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

func (d *dirState) readAck() (id uint64, off int64, ok bool) {
	b, err := ReadFile(filepath.Join(d.path, ackName))
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
