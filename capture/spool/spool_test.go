package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/rollgate/rollgate/testkit/testenv"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/export"
)

var errDown = errors.New("sink down")

// memSink stores copies of the batches it accepts. While down it fails
// every write; okLeft >= 0 accepts that many more writes and then goes down.
type memSink struct {
	mu     sync.Mutex
	down   bool
	okLeft int
	hang   bool // block until ctx ends instead of failing
	got    []uint64
	writes int
}

func newMemSink() *memSink { return &memSink{okLeft: -1} }

func (m *memSink) Write(ctx context.Context, b *export.Batch) error {
	m.mu.Lock()
	m.writes++
	if m.hang {
		m.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	defer m.mu.Unlock()
	if m.okLeft == 0 {
		m.down = true
	}
	if m.down {
		return errDown
	}
	if m.okLeft > 0 {
		m.okLeft--
	}
	for _, c := range b.Calls {
		m.got = append(m.got, c.SequenceID)
	}
	return nil
}

func (m *memSink) setDown(down bool) {
	m.mu.Lock()
	m.down, m.okLeft, m.hang = down, -1, false
	m.mu.Unlock()
}

func (m *memSink) rows() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.got)
}

// batch i holds rows 2i and 2i+1 of rollout "r".
func batch(i int) *export.Batch {
	b := &export.Batch{}
	for j := range 2 {
		seq := uint64(2*i + j)
		b.Calls = append(b.Calls, export.Call{
			SpanID: fmt.Sprintf("span-%d", seq), RolloutID: "r", SequenceID: seq, Model: "m",
			RequestBody:    strings.Repeat("x", 200),
			PromptTokenIDs: []uint32{1, 2, 3, uint32(seq)},
		})
	}
	return b
}

// wantRows is rows 0 .. 2n-1, the content of batches 0 .. n-1.
func wantRows(n int) []uint64 {
	w := make([]uint64, 2*n)
	for i := range w {
		w[i] = uint64(i)
	}
	return w
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fastConfig retries quickly so tests do not wait on backoff.
func fastConfig(dir string) Config {
	return Config{Dir: dir, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, DirectTimeout: time.Second}
}

func open(t *testing.T, cfg Config, sink export.Sink) *Spool {
	t.Helper()
	s, err := New(cfg, sink, "mem", prometheus.NewRegistry(), quietLog())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func write(t *testing.T, s *Spool, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := s.Write(context.Background(), batch(i)); err != nil {
			t.Fatalf("Write(batch %d): %v", i, err)
		}
	}
}

func drain(t *testing.T, s *Spool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v (stats %+v)", err, s.Stats())
	}
}

// waitBlocked waits until the spool has found itself full n times, the last
// time by the Write whose result done carries: that Write now waits for
// space. It fails the test if that Write returns first.
func waitBlocked(t *testing.T, s *Spool, n float64, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(s.m.full) < n {
		select {
		case err := <-done:
			t.Fatalf("Write returned %v before waiting for space", err)
		case <-time.After(time.Millisecond): // polling interval of this wait on rollgate_spool_full_total
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Write found the spool full after 10 s (full count %v, want %v)", testutil.ToFloat64(s.m.full), n)
		}
	}
}

func closeSpool(t *testing.T, s *Spool) {
	t.Helper()
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestHealthySinkWritesDirectly(t *testing.T) {
	dir := t.TempDir()
	sink := newMemSink()
	s := open(t, fastConfig(dir), sink)
	write(t, s, 0, 10)
	if got := sink.rows(); !slices.Equal(got, wantRows(10)) {
		t.Fatalf("rows = %v", got)
	}
	if st := s.Stats(); st.SpilledRows != 0 || st.Records != 0 {
		t.Fatalf("stats = %+v, want nothing spooled", st)
	}
	if f := segFiles(t, dir); len(f) != 0 {
		t.Fatalf("segment files on the happy path: %v", f)
	}
}

func TestOrderPreservedAcrossOutage(t *testing.T) {
	dir := t.TempDir()
	sink := newMemSink()
	cfg := fastConfig(dir)
	cfg.SegmentBytes = 2000 // several segments
	s := open(t, cfg, sink)
	write(t, s, 0, 5)
	sink.setDown(true)
	write(t, s, 5, 30)
	st := s.Stats()
	if st.Records != 25 || st.SpilledRows != 50 || st.Segments < 2 {
		t.Fatalf("during the outage: stats = %+v, want 25 records in several segments", st)
	}
	sink.setDown(false)
	// Written while the backlog replays: must queue behind it.
	write(t, s, 30, 40)
	drain(t, s)
	if got := sink.rows(); !slices.Equal(got, wantRows(40)) {
		t.Fatalf("rows = %v\nwant %v", got, wantRows(40))
	}
	if st := s.Stats(); st.ReplayedRows < 50 || st.Records != 0 || st.Bytes != 0 || st.ReplayErrors == 0 {
		t.Fatalf("after drain: stats = %+v", st)
	}
	if f := segFiles(t, dir); len(f) != 0 {
		t.Fatalf("segments left after drain: %v", f)
	}
	// Drained: the next write goes straight to the sink again.
	spilled := s.Stats().SpilledRows
	write(t, s, 40, 41)
	if st := s.Stats(); st.Records != 0 || st.SpilledRows != spilled {
		t.Fatalf("after recovery: stats = %+v, spilled before %d", st, spilled)
	}
	if got := sink.rows(); !slices.Equal(got, wantRows(41)) {
		t.Fatalf("rows = %v", got)
	}
}

func TestSlowSinkSpills(t *testing.T) {
	sink := newMemSink()
	cfg := fastConfig(t.TempDir())
	cfg.DirectTimeout = 20 * time.Millisecond
	cfg.ReplayTimeout = 20 * time.Millisecond
	s := open(t, cfg, sink)
	sink.mu.Lock()
	sink.hang = true
	sink.mu.Unlock()
	write(t, s, 0, 3) // each returns once spooled, not when the sink answers
	if st := s.Stats(); st.Records != 3 {
		t.Fatalf("stats = %+v, want 3 spooled", st)
	}
	sink.setDown(false)
	drain(t, s)
	if got := sink.rows(); !slices.Equal(got, wantRows(3)) {
		t.Fatalf("rows = %v", got)
	}
}

func TestRestartReplaysSpooledData(t *testing.T) {
	dir := t.TempDir()
	down := newMemSink()
	down.setDown(true)
	s := open(t, fastConfig(dir), down)
	write(t, s, 0, 20)
	closeSpool(t, s)
	if len(segFiles(t, dir)) == 0 {
		t.Fatal("no segment file left after Close with the sink down")
	}

	sink := newMemSink()
	sink.setDown(true)
	s2 := open(t, fastConfig(dir), sink)
	if st := s2.Stats(); st.Records != 20 || st.CorruptRecords != 0 {
		t.Fatalf("recovered stats = %+v, want 20 records", st)
	}
	sink.setDown(false)
	write(t, s2, 20, 25) // behind the recovered backlog
	drain(t, s2)
	if got := sink.rows(); !slices.Equal(got, wantRows(25)) {
		t.Fatalf("rows = %v", got)
	}
	closeSpool(t, s2)
	if f := segFiles(t, dir); len(f) != 0 {
		t.Fatalf("segments left: %v", f)
	}
}

// A restart after a partial replay sends neither the acknowledged batches
// again nor skips any.
func TestRestartAfterPartialReplay(t *testing.T) {
	dir := t.TempDir()
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(dir)
	cfg.SegmentBytes = 3000
	cfg.ReplayMaxRecords = 1 // one batch per replay write: 12 writes, 12 batches
	s := open(t, cfg, sink)
	write(t, s, 0, 30)
	// Accept 12 replays (crossing segment boundaries), then fail again.
	sink.mu.Lock()
	sink.down, sink.okLeft = false, 12
	sink.mu.Unlock()
	testenv.WaitFor(t, 20*time.Second, func() string { return fmt.Sprintf("24 rows replayed: stats = %+v", s.Stats()) },
		func() bool { return s.Stats().ReplayedRows >= 24 })
	closeSpool(t, s)
	if st := s.Stats(); st.Records != 18 {
		t.Fatalf("stats at close = %+v, want 18 left", st)
	}
	s2 := open(t, cfg, sink)
	if st := s2.Stats(); st.Records != 18 {
		t.Fatalf("recovered %d records, want 18", st.Records)
	}
	sink.setDown(false)
	drain(t, s2)
	if got := sink.rows(); !slices.Equal(got, wantRows(30)) {
		t.Fatalf("rows = %v\nwant %v", got, wantRows(30))
	}
}

func TestTornWriteRecovery(t *testing.T) {
	// want lists the batches recovered (nil: the first wantRecs); dropped
	// is the rows the damaged record held, counted as dropped.
	f := func(name string, damage func(t *testing.T, seg string, size int64), wantRecs int, want []uint64, dropped uint64) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			down := newMemSink()
			down.setDown(true)
			s := open(t, fastConfig(dir), down)
			write(t, s, 0, 5)
			closeSpool(t, s)
			segs := segFiles(t, dir)
			if len(segs) != 1 {
				t.Fatalf("segments = %v", segs)
			}
			info, err := os.Stat(segs[0])
			if err != nil {
				t.Fatal(err)
			}
			damage(t, segs[0], info.Size())

			sink := newMemSink()
			sink.setDown(true) // keep the recovered records in place while checking them
			s2 := open(t, fastConfig(dir), sink)
			st := s2.Stats()
			if st.Records != wantRecs || st.CorruptRecords != 1 || st.DroppedRows != dropped {
				t.Fatalf("after recovery: stats = %+v, want %d records, 1 corrupt, %d dropped rows", st, wantRecs, dropped)
			}
			if q, _ := filepath.Glob(segs[0] + ".*.quarantine"); len(q) != 1 {
				t.Fatalf("quarantine files = %v, want the damaged bytes kept aside", q)
			}
			if want == nil {
				want = wantRows(wantRecs)
			}
			sink.setDown(false)
			drain(t, s2)
			if got := sink.rows(); !slices.Equal(got, want) {
				t.Fatalf("rows = %v, want %v", got, want)
			}
			// The spool is usable after the repair.
			write(t, s2, 10, 12)
			if got := sink.rows(); !slices.Equal(got, append(want, 20, 21, 22, 23)) {
				t.Fatalf("rows = %v", got)
			}
		})
	}
	f("last record cut mid-payload", func(t *testing.T, seg string, size int64) {
		if err := os.Truncate(seg, size-10); err != nil {
			t.Fatal(err)
		}
	}, 4, nil, 0)
	f("last record cut mid-header", func(t *testing.T, seg string, size int64) {
		one := int64(len(AppendRecord(nil, batch(0))))
		if err := os.Truncate(seg, size-one+3); err != nil {
			t.Fatal(err)
		}
	}, 4, nil, 0)
	f("garbage appended", func(t *testing.T, seg string, size int64) {
		fh, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.Write([]byte{0x10, 0, 0, 0, 1, 2, 3, 4, 5})
		fh.Close()
	}, 5, nil, 0)
	f("bit flip in the third record", func(t *testing.T, seg string, size int64) {
		one := int64(len(AppendRecord(nil, batch(0))))
		fh, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		off := magicLen + 2*one + recordHeaderSize + 20
		var b [1]byte
		fh.ReadAt(b[:], off)
		b[0] ^= 1
		fh.WriteAt(b[:], off)
		fh.Close()
	}, 4, []uint64{0, 1, 2, 3, 6, 7, 8, 9}, 0) // the third batch is lost, the fourth and fifth kept
	f("bit flip in the third record's request body", func(t *testing.T, seg string, size int64) {
		rec := AppendRecord(nil, batch(0))
		fh, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		off := magicLen + 2*int64(len(rec)) + int64(bytes.Index(rec, []byte("xxxx")))
		fh.WriteAt([]byte{'y'}, off)
		fh.Close()
	}, 4, []uint64{0, 1, 2, 3, 6, 7, 8, 9}, 2) // its payload still decodes: its 2 rows are counted as dropped
	f("bit flip in the third record's length", func(t *testing.T, seg string, size int64) {
		one := int64(len(AppendRecord(nil, batch(0))))
		fh, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		off := magicLen + 2*one + 1
		var b [1]byte
		fh.ReadAt(b[:], off)
		b[0] ^= 0x40
		fh.WriteAt(b[:], off)
		fh.Close()
	}, 4, []uint64{0, 1, 2, 3, 6, 7, 8, 9}, 0)
	f("bit flip in the magic", func(t *testing.T, seg string, size int64) {
		fh, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.WriteAt([]byte{'X'}, 2)
		fh.Close()
	}, 5, nil, 0)
}

func TestCorruptSegmentHeaderMovedAside(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "00000000000000000007.seg"), []byte("not a segment at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "00000000000000000008.seg"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sink := newMemSink()
	s := open(t, fastConfig(dir), sink)
	if st := s.Stats(); st.CorruptRecords != 1 || st.Records != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "00000000000000000007.seg.0.quarantine")); err != nil || string(b) != "not a segment at all" {
		t.Fatalf("corrupt segment not kept aside: %q %v", b, err)
	}
	sink.setDown(true)
	write(t, s, 0, 1)
	// New segments are numbered after the ones found.
	if segs := segFiles(t, dir); len(segs) != 1 || filepath.Base(segs[0]) != "00000000000000000009.seg" {
		t.Fatalf("segments = %v", segs)
	}
}

func TestFullPolicyDrop(t *testing.T) {
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(t.TempDir())
	cfg.FullPolicy = Drop
	one := int64(len(AppendRecord(nil, batch(0))))
	cfg.MaxBytes = 3*one + one/2 // room for 3 records
	s := open(t, cfg, sink)
	write(t, s, 0, 3)
	for i := 3; i < 5; i++ {
		if err := s.Write(context.Background(), batch(i)); !errors.Is(err, ErrFull) {
			t.Fatalf("Write(batch %d) on a full spool = %v, want ErrFull", i, err)
		}
	}
	if st := s.Stats(); st.DroppedRows != 4 || st.Records != 3 {
		t.Fatalf("stats = %+v, want 4 rows dropped, 3 records", st)
	}
	sink.setDown(false)
	drain(t, s)
	write(t, s, 5, 6)
	if got, want := sink.rows(), []uint64{0, 1, 2, 3, 4, 5, 10, 11}; !slices.Equal(got, want) {
		t.Fatalf("rows = %v, want %v", got, want)
	}
}

func TestFullPolicyBlock(t *testing.T) {
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(t.TempDir())
	one := int64(len(AppendRecord(nil, batch(0))))
	cfg.MaxBytes = 2*one + one/2
	s := open(t, cfg, sink)
	write(t, s, 0, 2)

	// A caller whose context ends while waiting gets ErrFull and nothing is counted as dropped.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := s.Write(ctx, batch(100))
	cancel()
	if !errors.Is(err, ErrFull) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write on a full spool with an ending context = %v", err)
	}
	// A patient caller waits until the replayer frees space.
	done := make(chan error, 1)
	go func() { done <- s.Write(context.Background(), batch(2)) }()
	waitBlocked(t, s, 2, done)
	select {
	case err := <-done:
		t.Fatalf("Write returned %v while the spool was full", err)
	default:
	}
	sink.setDown(false)
	if err := <-done; err != nil {
		t.Fatalf("blocked Write: %v", err)
	}
	drain(t, s)
	if got := sink.rows(); !slices.Equal(got, wantRows(3)) {
		t.Fatalf("rows = %v", got)
	}
	if st := s.Stats(); st.DroppedRows != 0 {
		t.Fatalf("stats = %+v, want nothing dropped", st)
	}
}

func TestBatchLargerThanSpool(t *testing.T) {
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(t.TempDir())
	cfg.MaxBytes = 100
	s := open(t, cfg, sink)
	if err := s.Write(context.Background(), batch(0)); !errors.Is(err, ErrFull) {
		t.Fatalf("err = %v, want ErrFull", err)
	}
	if st := s.Stats(); st.DroppedRows != 2 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestCloseBlocksFurtherWrites(t *testing.T) {
	sink := newMemSink()
	s := open(t, fastConfig(t.TempDir()), sink)
	closeSpool(t, s)
	if err := s.Write(context.Background(), batch(0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestCloseWakesBlockedWriter(t *testing.T) {
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(t.TempDir())
	cfg.MaxBytes = int64(len(AppendRecord(nil, batch(0)))) + 10
	s := open(t, cfg, sink)
	write(t, s, 0, 1)
	done := make(chan error, 1)
	go func() { done <- s.Write(context.Background(), batch(1)) }()
	waitBlocked(t, s, 1, done)
	closeSpool(t, s)
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked Write after Close = %v", err)
	}
}

func TestDirectoryLocked(t *testing.T) {
	dir := t.TempDir()
	open(t, fastConfig(dir), newMemSink())
	_, err := New(fastConfig(dir), newMemSink(), "second", nil, quietLog())
	if err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("second New on the same dir = %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	f := func(cfg Config, want string) {
		t.Helper()
		_, err := New(cfg, newMemSink(), "x", nil, quietLog())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("New(%+v) = %v, want %q", cfg, err, want)
		}
	}
	f(Config{}, "Dir is required")
	f(Config{Dir: t.TempDir(), FullPolicy: "spill"}, `unknown full policy "spill"`)
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(t.TempDir())
	s, err := New(cfg, sink, "clickhouse", reg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	write(t, s, 0, 3)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "sink" || l[0].GetValue() != "clickhouse" {
			t.Fatalf("%s labels = %v", mf.GetName(), l)
		}
		if m.GetGauge() != nil {
			got[mf.GetName()] = m.GetGauge().GetValue()
		} else {
			got[mf.GetName()] = m.GetCounter().GetValue()
		}
	}
	for name, want := range map[string]float64{
		"rollgate_spool_records":            3,
		"rollgate_spool_spilled_rows_total": 6,
		"rollgate_spool_max_bytes":          1 << 30,
	} {
		if got[name] != want {
			t.Fatalf("%s = %v, want %v (all: %v)", name, got[name], want, got)
		}
	}
	for _, name := range []string{"rollgate_spool_bytes", "rollgate_spool_replayed_rows_total", "rollgate_spool_dropped_rows_total",
		"rollgate_spool_corrupt_records_total", "rollgate_spool_replay_errors_total", "rollgate_spool_full_total"} {
		if _, ok := got[name]; !ok {
			t.Fatalf("metric %s not registered", name)
		}
	}
	if got["rollgate_spool_bytes"] <= 0 {
		t.Fatalf("rollgate_spool_bytes = %v", got["rollgate_spool_bytes"])
	}
	// The same name twice on one registry is an error, not a panic.
	if _, err := New(Config{Dir: t.TempDir()}, sink, "clickhouse", reg, quietLog()); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("duplicate registration: %v", err)
	}
}

func TestBackgroundSync(t *testing.T) {
	dir := t.TempDir()
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(dir)
	cfg.SyncInterval = time.Millisecond
	s := open(t, cfg, sink)
	write(t, s, 0, 10)
	closeSpool(t, s)
	sink.setDown(false)
	s2 := open(t, cfg, sink)
	drain(t, s2)
	if got := sink.rows(); !slices.Equal(got, wantRows(10)) {
		t.Fatalf("rows = %v", got)
	}
}

// Concurrent writers: every batch arrives exactly once, and each writer's
// batches in its own order.
func TestConcurrentWriters(t *testing.T) {
	sink := newMemSink()
	s := open(t, fastConfig(t.TempDir()), sink)
	const writers, per = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if i == 10 && w == 0 {
					sink.setDown(true)
				}
				if i == 15 && w == 0 {
					sink.setDown(false)
				}
				if err := s.Write(context.Background(), batch(w*per+i)); err != nil {
					t.Errorf("Write: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	drain(t, s)
	got := sink.rows()
	if len(got) != 2*writers*per {
		t.Fatalf("%d rows, want %d", len(got), 2*writers*per)
	}
	last := make([]int64, writers)
	for w := range last {
		last[w] = -1
	}
	for _, seq := range got {
		w := seq / (2 * per)
		if int64(seq) <= last[w] {
			t.Fatalf("writer %d: row %d after row %d", w, seq, last[w])
		}
		last[w] = int64(seq)
	}
	sorted := slices.Clone(got)
	slices.Sort(sorted)
	if !slices.Equal(sorted, wantRows(writers*per)) {
		t.Fatalf("rows not exactly once: %v", sorted)
	}
}
