package capture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollgate/rollgate/capture/spool"
)

// The write-ahead log (WAL) makes a call recoverable once its answer is on
// its way to the client, before it waits in the capture queue: the call's
// raw record (see appendWALRecord) is handed to the kernel with one write(2)
// on the hot path, and acknowledged once the call's rows are in the sink or
// the spool. A killed process (SIGKILL, OOM kill, panic) loses nothing the
// kernel was given: the next process replays the records never
// acknowledged into capture, and the rows are written with
// export.WriteAgain, so a store with export.OnceWriter (ClickHouse) keeps
// each row once.
//
// # Where the window is
//
// A non-streamed call is logged in Pipeline.TryPush, which the gateway calls
// before the response is written: nothing of the answer reaches the client
// before its record is in the kernel. A streamed call is logged
// (Pipeline.Commit) when the backend's data: [DONE], an error event or the
// end of the stream arrives, before those bytes are returned to the client;
// the events before it reached the client earlier, but the call is not
// complete for the client without them. A stream the client abandons is
// logged when it ends. So no window is left for a process kill, except for
// calls the WAL refused (full or a write error), which are counted in
// rollgate_capture_wal_skipped_total.
//
// # fsync policy (machine crashes)
//
// Records are not fsynced per call. With WALConfig.SyncInterval > 0
// (--capture-wal-sync-interval, default 1s) the segment being written is
// fsynced at that interval when it has new records, so an OS crash or power
// loss can lose the calls answered in the last interval; 0 never fsyncs (the
// kernel writes back on its own schedule, about 30 s on Linux).
// Acknowledgements are never fsynced: a lost one only replays a call, which
// WriteAgain stores once.
//
// # Layout
//
// WALConfig.Dir (mode 0700, checked as the spool folder is: spool.CheckDir)
// holds segment files NNNNNNNNNNNNNNNNNNNN.wal (the 8-byte magic, then
// records: payload length and CRC-32C, uint32 little endian each, then the
// payload) and beside each an .ack file (walAckMagic, then the offsets,
// uint32 little endian, of its acknowledged records; an .ack file without
// the magic, written by an earlier release, holds record indices). Files
// are 0600 and never opened through a symbolic link. A segment is deleted
// once it is full (a newer one is being written) and all its records are
// acknowledged.
//
// # Damage
//
// At open, a damaged region of a segment (a bad magic, length or CRC, a
// torn tail) is copied to <segment>.<offset>.quarantine beside it, counted
// in rollgate_capture_wal_corrupt_records_total and logged; the scan
// resynchronises on the next valid record (spool.ScanRecords), so the
// records after it are replayed. A record that does not decode at replay,
// or whose assembly panics, is set aside the same way and acknowledged.

// walMagic starts every WAL segment; its last byte is the format version.
const walMagic = "RGWAL001"

// walAckMagic starts an .ack file holding record offsets; an .ack file
// without it (an earlier release) holds record indices.
const walAckMagic = "RGWALAK2"

// walFrame is how spool.ScanRecords finds the WAL's records.
var walFrame = spool.RecordFrame{MaxPayload: maxWALRecord, FirstByte: func(b byte) bool { return b == walVersion || b == walVersionRows }}

const (
	walSuffix    = ".wal"
	walAckSuffix = ".ack"
	walHeader    = 8
	// maxWALRecord bounds one record's payload; a header claiming more is corrupt.
	maxWALRecord = 1 << 30
)

var walCRC = crc32.MakeTable(crc32.Castagnoli)

// errWALFull is why a record did not fit in WALConfig.MaxBytes.
var errWALFull = errors.New("capture WAL full")

// WALConfig sizes the write-ahead log. Zero values take the documented
// defaults; Dir is required.
type WALConfig struct {
	// Dir holds the segment files; created if missing. Only one process may
	// use it: put it in the spool folder, whose lock keeps a second one out.
	Dir string `yaml:"-"`
	// MaxBytes bounds the segments on disk (default 512 MiB). A call that
	// does not fit is not logged (it is captured as usual, but a kill before
	// its rows are stored loses it) and counted in
	// rollgate_capture_wal_skipped_total{reason="full"}.
	MaxBytes int64 `yaml:"wal_max_bytes"`
	// SegmentBytes is the size at which a new segment is started (default
	// MaxBytes/8, at most 16 MiB).
	SegmentBytes int64 `yaml:"-"`
	// SyncInterval is how often the segment being written is fsynced when it
	// has new records (0 = never; see the package notes on the fsync policy;
	// RegisterFlags's default is DefaultWALSyncInterval).
	SyncInterval time.Duration `yaml:"wal_sync_interval"`
}

func (c *WALConfig) setDefaults() error {
	if c.Dir == "" {
		return errors.New("capture WAL: WALConfig.Dir is required (it lives in --spool-dir)")
	}
	c.fillDefaults()
	return nil
}

// fillDefaults sets the zero sizes to their defaults.
func (c *WALConfig) fillDefaults() {
	if c.MaxBytes <= 0 {
		c.MaxBytes = 512 << 20
	}
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = min(c.MaxBytes/8, 16<<20)
	}
	c.SegmentBytes = min(c.SegmentBytes, 1<<31) // record offsets are uint32
}

// walRef names one record: its segment and its offset in that segment.
type walRef struct {
	seg uint64
	off uint32
}

// walSegment is one segment file and the state of its records.
type walSegment struct {
	id       uint64
	size     int64
	appended uint32 // records written (or found at open)
	acked    uint32 // of which acknowledged
	ackFile  *os.File
	// recovered: left by an earlier process; acked holds the offsets found
	// in its .ack file; offsets, the valid records' offsets, replayed by
	// replay (nil once replayed).
	recovered map[uint32]bool
	offsets   []uint32
}

// WAL is the capture write-ahead log (see the notes above WALConfig). It is
// safe for concurrent use.
type WAL struct {
	cfg WALConfig
	log *slog.Logger

	mu    sync.Mutex
	segs  map[uint64]*walSegment
	order []uint64 // recovered segments, oldest first, for Replay
	cur   *walSegment
	w     *os.File // cur's file
	dirty bool     // w has writes not fsynced
	// sealed are files of segments ended since the last fsync: syncLoop
	// fsyncs and closes them outside mu, so appends never wait for a disk.
	sealed []*os.File
	bytes  int64 // size of every segment on disk
	nextID uint64
	closed bool

	stop chan struct{}
	done chan struct{}

	lastWarn atomic.Int64 // unix nanos of the last "skipped" warning

	logged, skippedFull, skippedErr, acked, replayed, corrupt prometheus.Counter
	sizeGauge                                                 prometheus.Gauge
}

// OpenWAL opens (or creates) the WAL in cfg.Dir and finds the records an
// earlier process left unacknowledged (see Replay). Its metrics are
// registered on reg unless it is nil.
func OpenWAL(cfg WALConfig, reg prometheus.Registerer, log *slog.Logger) (*WAL, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	w := &WAL{cfg: cfg, log: log.With("wal_dir", cfg.Dir), segs: map[uint64]*walSegment{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.metrics()
	if reg != nil {
		for _, c := range []prometheus.Collector{w.logged, w.skippedFull, w.skippedErr, w.acked, w.replayed, w.corrupt, w.sizeGauge} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("capture WAL: registering metrics: %w", err)
			}
		}
	}
	if err := spool.CheckDir(cfg.Dir); err != nil {
		return nil, fmt.Errorf("capture WAL: %w", err)
	}
	if err := w.recover(); err != nil {
		return nil, err
	}
	w.sizeGauge.Set(float64(w.bytes))
	if cfg.SyncInterval > 0 {
		go w.syncLoop()
	} else {
		close(w.done)
	}
	return w, nil
}

func (w *WAL) metrics() {
	c := func(name, help string, labels prometheus.Labels) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	w.logged = c("rollgate_capture_wal_records_total", "Answered calls logged to the capture write-ahead log before their answer completed.", nil)
	const skipHelp = "Answered calls not logged to the capture write-ahead log (captured as usual, but a process kill before their rows are stored loses them): full = --capture-wal-max-bytes reached, error = a write failed."
	w.skippedFull = c("rollgate_capture_wal_skipped_total", skipHelp, prometheus.Labels{"reason": "full"})
	w.skippedErr = c("rollgate_capture_wal_skipped_total", skipHelp, prometheus.Labels{"reason": "error"})
	w.acked = c("rollgate_capture_wal_acked_total", "Write-ahead log records acknowledged: their rows are in the store or the spool.", nil)
	w.replayed = c("rollgate_capture_wal_replayed_total", "Write-ahead log records an earlier process left unacknowledged, replayed into capture at start.", nil)
	w.corrupt = c("rollgate_capture_wal_corrupt_records_total", "Write-ahead log records or regions found damaged at start, undecodable at replay, or whose assembly panicked: set aside in a quarantine file beside their segment; the other records are replayed.", nil)
	w.sizeGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rollgate_capture_wal_bytes", Help: "Size of the capture write-ahead log's segments on disk."})
}

func (w *WAL) segPath(id uint64, suffix string) string {
	return filepath.Join(w.cfg.Dir, fmt.Sprintf("%020d%s", id, suffix))
}

// recover scans the segments left in Dir: their valid records, and which of
// them their .ack file acknowledges.
func (w *WAL) recover() error {
	ents, err := os.ReadDir(w.cfg.Dir)
	if err != nil {
		return fmt.Errorf("capture WAL: read %s: %w", w.cfg.Dir, err)
	}
	var ids []uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, walSuffix) {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSuffix(name, walSuffix), 10, 64)
		if err != nil {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	pending := 0
	for _, id := range ids {
		w.nextID = id + 1
		seg, err := w.recoverSegment(id)
		if err != nil {
			return err
		}
		if seg.acked == seg.appended {
			w.removeFiles(id)
			continue
		}
		w.segs[id] = seg
		w.order = append(w.order, id)
		w.bytes += seg.size
		pending += int(seg.appended - seg.acked)
	}
	if pending > 0 {
		w.log.Warn("capture WAL: replaying calls a previous run answered but had not stored (it was killed)", "calls", pending, "segments", len(w.order))
	}
	return nil
}

// recoverSegment scans segment id: its valid records, the damaged regions
// between them (quarantined and counted), and which records its .ack file
// acknowledges.
func (w *WAL) recoverSegment(id uint64) (*walSegment, error) {
	path := w.segPath(id, walSuffix)
	b, err := spool.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("capture WAL: read segment %d: %w", id, err)
	}
	seg := &walSegment{id: id, size: int64(len(b)), recovered: map[uint32]bool{}}
	r := bytes.NewReader(b)
	if !strings.HasPrefix(string(b), walMagic) {
		w.quarantine(path, r, 0, min(int64(len(b)), walHeader), errors.New("segment header is not "+walMagic))
	}
	err = spool.ScanRecords(r, walHeader, int64(len(b)), walFrame, func(off, _ int64) {
		seg.offsets = append(seg.offsets, uint32(off))
	}, func(off, end int64, why error) {
		w.quarantine(path, r, off, end, why)
	})
	if err != nil {
		return nil, fmt.Errorf("capture WAL: read segment %d: %w", id, err)
	}
	seg.appended = uint32(len(seg.offsets))
	a, err := spool.ReadFile(w.segPath(id, walAckSuffix))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		w.log.Warn("capture WAL: unreadable .ack file; replaying its segment whole (WriteAgain stores each row once)", "segment", id, "err", err)
	}
	legacy := !strings.HasPrefix(string(a), walAckMagic)
	if !legacy {
		a = a[len(walAckMagic):]
	}
	for i := 0; i+4 <= len(a); i += 4 {
		x := binary.LittleEndian.Uint32(a[i:])
		if legacy { // a record index: the x-th valid record
			if x >= seg.appended {
				continue
			}
			x = seg.offsets[x]
		} else if _, ok := slices.BinarySearch(seg.offsets, x); !ok {
			continue
		}
		if !seg.recovered[x] {
			seg.recovered[x] = true
			seg.acked++
		}
	}
	return seg, nil
}

// quarantine copies the damaged bytes [off, end) of the segment at path to
// a quarantine file beside it, counts and logs them.
func (w *WAL) quarantine(path string, r io.ReaderAt, off, end int64, why error) {
	w.corrupt.Inc()
	q := spool.QuarantineName(path, off)
	if err := spool.Quarantine(q, r, off, end); err != nil {
		w.log.Error("capture WAL: cannot keep a damaged region aside", "file", path, "offset", off, "err", err)
		q = ""
	}
	w.log.Error("capture WAL: damaged region set aside; the records after it are replayed", "file", path,
		"offset", off, "bytes", end-off, "quarantine", q, "err", why)
}

// setAside quarantines the record ref (it does not decode, or its assembly
// panicked) and acknowledges it, so that no later start replays it again.
func (w *WAL) setAside(ref walRef, why error) {
	path := w.segPath(ref.seg, walSuffix)
	f, err := spool.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		w.corrupt.Inc()
		w.log.Error("capture WAL: cannot set a record aside", "file", path, "offset", ref.off, "err", err, "why", why)
	} else {
		var hdr [walHeader]byte
		end := int64(ref.off) + walHeader
		if _, err := f.ReadAt(hdr[:], int64(ref.off)); err == nil {
			end += int64(binary.LittleEndian.Uint32(hdr[:]))
		}
		w.quarantine(path, f, int64(ref.off), end, why)
		f.Close()
	}
	w.ack([]walRef{ref})
}

func (w *WAL) removeFiles(id uint64) {
	for _, s := range []string{walSuffix, walAckSuffix} {
		if err := os.Remove(w.segPath(id, s)); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("capture WAL: removing an acknowledged segment", "segment", id, "err", err)
		}
	}
}

// replay calls f, in order, with every record an earlier process left
// unacknowledged, and its reference for ack. It reads one segment at a
// time; f must not retain payload.
func (w *WAL) replay(f func(ref walRef, payload []byte) bool) error {
	w.mu.Lock()
	order := slices.Clone(w.order)
	w.mu.Unlock()
	for _, id := range order {
		w.mu.Lock()
		seg := w.segs[id]
		var (
			acked   map[uint32]bool
			offsets []uint32
		)
		if seg != nil {
			acked, offsets = maps.Clone(seg.recovered), seg.offsets
			seg.offsets = nil
		}
		w.mu.Unlock()
		if seg == nil {
			continue
		}
		b, err := spool.ReadFile(w.segPath(id, walSuffix))
		if err != nil {
			return fmt.Errorf("capture WAL: read segment %d: %w", id, err)
		}
		for _, off := range offsets {
			if acked[off] || int64(off)+walHeader > int64(len(b)) {
				continue
			}
			n := int64(binary.LittleEndian.Uint32(b[off:]))
			if int64(off)+walHeader+n > int64(len(b)) {
				continue
			}
			w.replayed.Inc()
			if !f(walRef{seg: id, off: off}, b[int64(off)+walHeader:int64(off)+walHeader+n]) {
				return nil
			}
		}
	}
	return nil
}

// append writes one framed record (header space included, filled here) with
// one write(2). It returns the record's reference, or an error when the WAL
// is full or the write failed (counted and logged; the call is not logged).
func (w *WAL) append(rec []byte) (walRef, error) {
	payload := rec[walHeader:]
	binary.LittleEndian.PutUint32(rec, uint32(len(payload)))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(payload, walCRC))
	n := int64(len(rec))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return walRef{}, errors.New("capture WAL closed")
	}
	if w.bytes+n > w.cfg.MaxBytes {
		w.skippedFull.Inc()
		w.warnSkipped("full: raise --capture-wal-max-bytes, or add store capacity (calls wait in the WAL until their rows are stored or spooled)", errWALFull)
		return walRef{}, errWALFull
	}
	if w.cur == nil || w.cur.size+n > w.cfg.SegmentBytes {
		if err := w.rotateLocked(); err != nil {
			w.skippedErr.Inc()
			w.warnSkipped("cannot start a segment (check the disk of --spool-dir)", err)
			return walRef{}, err
		}
	}
	if _, err := w.w.Write(rec); err != nil {
		w.skippedErr.Inc()
		w.warnSkipped("write failed (check the disk of --spool-dir)", err)
		// The segment may hold part of the record now: end it, so the next
		// record starts a clean one (the torn tail is skipped at open).
		w.sealLocked()
		return walRef{}, fmt.Errorf("capture WAL: %w", err)
	}
	ref := walRef{seg: w.cur.id, off: uint32(w.cur.size)}
	w.cur.appended++
	w.cur.size += n
	w.bytes += n
	w.dirty = true
	w.logged.Inc()
	w.sizeGauge.Set(float64(w.bytes))
	return ref, nil
}

// warnSkipped logs a skipped call at most once a second (every skip is counted).
func (w *WAL) warnSkipped(why string, err error) {
	now := time.Now().UnixNano()
	if last := w.lastWarn.Load(); now-last > int64(time.Second) && w.lastWarn.CompareAndSwap(last, now) {
		w.log.Warn("capture WAL: answered call not logged; a process kill before its rows are stored would lose it ("+why+"); see rollgate_capture_wal_skipped_total",
			"err", err, "wal_bytes", w.bytes, "max_bytes", w.cfg.MaxBytes)
	}
}

// rotateLocked seals the current segment and starts the next one.
func (w *WAL) rotateLocked() error {
	w.sealLocked()
	id := w.nextID
	f, err := spool.OpenFile(w.segPath(id, walSuffix), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, spool.FileMode)
	if err != nil {
		return fmt.Errorf("capture WAL: create segment: %w", err)
	}
	if _, err := f.Write([]byte(walMagic)); err != nil {
		f.Close()
		_ = os.Remove(w.segPath(id, walSuffix))
		return fmt.Errorf("capture WAL: write segment header: %w", err)
	}
	w.nextID++
	w.cur = &walSegment{id: id, size: int64(len(walMagic))}
	w.w = f
	w.segs[id] = w.cur
	w.bytes += w.cur.size
	return nil
}

// sealLocked ends the segment being written (it is deleted once all its
// records are acknowledged).
func (w *WAL) sealLocked() {
	if w.cur == nil {
		return
	}
	if w.cfg.SyncInterval > 0 && !w.closed {
		w.sealed = append(w.sealed, w.w) // fsynced and closed by syncLoop
	} else {
		_ = w.w.Close()
	}
	seg := w.cur
	w.cur, w.w, w.dirty = nil, nil, false
	w.maybeRemoveLocked(seg)
}

// maybeRemoveLocked deletes seg once it is sealed and fully acknowledged.
func (w *WAL) maybeRemoveLocked(seg *walSegment) {
	if seg == w.cur || seg.acked < seg.appended {
		return
	}
	if seg.ackFile != nil {
		_ = seg.ackFile.Close()
	}
	w.removeFiles(seg.id)
	delete(w.segs, seg.id)
	w.bytes -= seg.size
	w.sizeGauge.Set(float64(w.bytes))
}

// ack records that the rows of refs are in the sink or the spool: one
// write(2) per segment to its .ack file, and segments wholly acknowledged
// are deleted.
func (w *WAL) ack(refs []walRef) {
	if len(refs) == 0 {
		return
	}
	slices.SortFunc(refs, func(a, b walRef) int {
		if a.seg != b.seg {
			if a.seg < b.seg {
				return -1
			}
			return 1
		}
		return int(int64(a.off) - int64(b.off))
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	var buf []byte
	for i := 0; i < len(refs); {
		j := i
		for j < len(refs) && refs[j].seg == refs[i].seg {
			j++
		}
		seg := w.segs[refs[i].seg]
		if seg != nil {
			buf = buf[:0]
			if seg.ackFile == nil {
				// A new file (an earlier release's, holding indices, is
				// replaced: its acknowledgements are in seg.recovered).
				f, err := spool.OpenFile(w.segPath(seg.id, walAckSuffix), os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, spool.FileMode)
				if err != nil {
					w.log.Warn("capture WAL: recording acknowledgements failed (their calls are replayed after a kill; WriteAgain stores them once)", "err", err)
				}
				seg.ackFile = f
				buf = append(buf, walAckMagic...)
				for off := range seg.recovered {
					buf = binary.LittleEndian.AppendUint32(buf, off)
				}
			}
			for _, r := range refs[i:j] {
				buf = binary.LittleEndian.AppendUint32(buf, r.off)
			}
			if seg.ackFile != nil {
				_, _ = seg.ackFile.Write(buf)
			}
			seg.acked += uint32(j - i)
			w.acked.Add(float64(j - i))
			w.maybeRemoveLocked(seg)
		}
		i = j
	}
}

func (w *WAL) syncLoop() {
	defer close(w.done)
	t := time.NewTicker(w.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			// fsync outside mu: appends go on meanwhile. A file is closed
			// only here or by Close (after this loop ended), never while
			// it is being synced.
			w.mu.Lock()
			files := w.sealed
			w.sealed = nil
			if w.dirty && w.w != nil {
				files = append(files, w.w)
				w.dirty = false
			}
			cur := w.w
			w.mu.Unlock()
			for _, f := range files {
				if err := f.Sync(); err != nil {
					w.log.Error("capture WAL: fsync failed (an OS crash may lose recent calls)", "err", err)
				}
				if f != cur {
					_ = f.Close()
				}
			}
		case <-w.stop:
			return
		}
	}
}

// WALStats is a snapshot of the WAL: its size on disk and records not yet acknowledged.
type WALStats struct {
	Bytes   int64
	Pending int
}

// Stats returns a snapshot of the WAL's size and unacknowledged records.
func (w *WAL) Stats() WALStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := WALStats{Bytes: w.bytes}
	for _, s := range w.segs {
		st.Pending += int(s.appended - s.acked)
	}
	return st
}

// Close fsyncs and closes the segment being written; it is deleted when
// every record was acknowledged (a clean shutdown leaves an empty folder).
func (w *WAL) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true // appends fail from here
	w.mu.Unlock()
	close(w.stop)
	<-w.done // syncLoop has ended: the files are ours
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	files := w.sealed
	if w.w != nil {
		files = append(files, w.w)
	}
	for _, f := range files {
		if err := f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("capture WAL: fsync on close: %w", err))
		}
		if f != w.w {
			_ = f.Close()
		}
	}
	w.sealed = nil
	w.sealLocked()
	for _, s := range w.segs {
		if s.ackFile != nil {
			_ = s.ackFile.Close()
			s.ackFile = nil
		}
	}
	return errors.Join(errs...)
}
