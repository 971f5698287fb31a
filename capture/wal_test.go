package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/internal/openai"
)

// streamPending is a finished streamed chat call whose payloads are kept for
// the WAL (keepRaw), as the gateway makes one with a WAL on.
func streamPending(seq uint64) *Pending {
	p := AcquirePending()
	p.keepRaw = true
	p.Endpoint = openai.ChatCompletions
	p.Meta = export.Call{RolloutID: "r", AttemptID: "a", SequenceID: seq, HTTPStatus: 200, Endpoint: "/v1/chat/completions",
		Model: "m", Backend: "b", Stream: true, StartTimeUnixNano: 10, EndTimeUnixNano: 20, TTFTNano: 5}
	copy(p.IDs.Span[:], fmt.Sprintf("%016x", seq))
	copy(p.IDs.Trace[:], fmt.Sprintf("%032x", seq))
	p.IDs.Set = true
	p.Request = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, ev := range []string{
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"he"},"token_ids":[7],"logprobs":{"content":[{"token":"he","logprob":-0.5}]}}],"prompt_token_ids":[1,2]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"llo"},"token_ids":[8],"finish_reason":"stop","logprobs":{"content":[{"token":"llo","logprob":-0.25}]}}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`,
		`[DONE]`,
	} {
		p.AddEvent([]byte(ev))
	}
	return p
}

// roundTrip encodes p and decodes the record into a fresh Pending.
func roundTrip(t *testing.T, p *Pending) *Pending {
	t.Helper()
	rec := appendWALRecord(nil, p, &walScratch{})
	q := AcquirePending()
	if err := decodeWALRecord(rec[walHeader:], q); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return q
}

// TestWALRecordRowsMatch: a call decoded from its WAL record gives the rows
// the live call gives, streamed (re-assembled from its payloads) and not.
func TestWALRecordRowsMatch(t *testing.T) {
	f := func(name string, p *Pending) {
		t.Helper()
		q := roundTrip(t, p)
		var a Assembler
		want, got := Rows(p, &a), Rows(q, &a)
		if len(want) == 0 || !reflect.DeepEqual(want, got) {
			t.Fatalf("%s: rows from the record differ:\n got %+v\nwant %+v", name, got, want)
		}
	}
	f("non-streamed", pending(3))
	f("streamed", streamPending(4))
	p := pending(5)
	p.NoBodies, p.N = true, 1
	copy(p.IDs.Parent[:], "00f067aa0ba902b7")
	p.IDs.HasParent = true
	f("no bodies, parent span", p)
	p = streamPending(6)
	p.Engine = engines.Replica{Kind: openai.KindLlamaCpp, BaseURL: "http://10.0.0.1:8080/v1"}
	f("with its engine", p)
	if q := roundTrip(t, p); q.Engine != p.Engine {
		t.Fatalf("the record's engine is %+v, want %+v (the replayed call's id fallback needs it)", q.Engine, p.Engine)
	}
}

// openTestWAL opens a WAL in dir with metrics on a registry of its own.
func openTestWAL(t *testing.T, dir string, cfg WALConfig) *WAL {
	t.Helper()
	cfg.Dir = dir
	w, err := OpenWAL(cfg, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// replayed collects the sequence ids of the records w replays.
func replayed(t *testing.T, w *WAL) []uint64 {
	t.Helper()
	var seqs []uint64
	if err := w.replay(func(_ walRef, payload []byte) bool {
		q := AcquirePending()
		if err := decodeWALRecord(payload, q); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, q.Meta.SequenceID)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return seqs
}

// TestWALRecoversUnacknowledged: records acknowledged are not replayed by
// the next process, the others are, in order; a torn tail is skipped and
// counted; wholly acknowledged segments are deleted.
func TestWALRecoversUnacknowledged(t *testing.T) {
	dir := t.TempDir()
	w := openTestWAL(t, dir, WALConfig{SegmentBytes: 2 << 10})
	var refs []walRef
	for i := range 20 {
		ref, err := w.append(appendWALRecord(nil, pending(uint64(i)), &walScratch{}))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	if refs[19].seg == refs[0].seg {
		t.Fatal("20 records fit in one 2 KiB segment; the test needs several")
	}
	// Acknowledge all but 3, 4 and 17; the first segments go away.
	var ack []walRef
	for i, r := range refs {
		if i != 3 && i != 4 && i != 17 {
			ack = append(ack, r)
		}
	}
	w.ack(ack)
	// The process is killed: no Close. A torn record at the end of the
	// segment being written, as a kill in the middle of a write leaves.
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%020d%s", refs[19].seg, walSuffix)), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{200, 0, 0, 0, 1, 2})
	f.Close()

	w2 := openTestWAL(t, dir, WALConfig{SegmentBytes: 2 << 10})
	if got := replayed(t, w2); !reflect.DeepEqual(got, []uint64{3, 4, 17}) {
		t.Fatalf("replayed %v, want [3 4 17]", got)
	}
	if got := testutil.ToFloat64(w2.corrupt); got != 1 {
		t.Fatalf("corrupt records = %v, want 1 (the torn tail)", got)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+walSuffix))
	if len(segs) > 2 {
		t.Fatalf("%d segments left, want at most the two holding unacknowledged records: %v", len(segs), segs)
	}
	// Acknowledging the replayed records and closing leaves nothing.
	w2.ack([]walRef{refs[3], refs[4], refs[17]})
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	// Only the torn tail, kept aside, is left.
	torn := fmt.Sprintf("%020d%s.%d.quarantine", refs[19].seg, walSuffix, refs[19].off+uint32(len(appendWALRecord(nil, pending(19), &walScratch{}))))
	if left, _ := os.ReadDir(dir); len(left) != 1 || left[0].Name() != torn {
		t.Fatalf("files left after everything was acknowledged: %v, want only %s", left, torn)
	}
}

// TestWALFullIsCounted: past MaxBytes a call is not logged, and that is
// counted, never silent; acknowledging frees the space again.
func TestWALFullIsCounted(t *testing.T) {
	w := openTestWAL(t, t.TempDir(), WALConfig{MaxBytes: 4 << 10, SegmentBytes: 1 << 10})
	defer w.Close()
	var refs []walRef
	var full int
	for i := range 40 {
		ref, err := w.append(appendWALRecord(nil, pending(uint64(i)), &walScratch{}))
		switch {
		case errors.Is(err, errWALFull):
			full++
		case err != nil:
			t.Fatal(err)
		default:
			refs = append(refs, ref)
		}
	}
	if full == 0 || testutil.ToFloat64(w.skippedFull) != float64(full) {
		t.Fatalf("%d appends refused as full, counter says %v", full, testutil.ToFloat64(w.skippedFull))
	}
	w.ack(refs)
	if _, err := w.append(appendWALRecord(nil, pending(99), &walScratch{})); err != nil {
		t.Fatalf("after every record was acknowledged: %v", err)
	}
}

// memCalls is a sink that keeps every call row it is given, and counts
// WriteOnce uses.
type memCalls struct {
	mu    sync.Mutex
	spans map[string]int
	once  int
	block chan struct{} // nil: never block
}

func (m *memCalls) Write(ctx context.Context, b *export.Batch) error {
	if m.block != nil {
		select {
		case <-m.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range b.Calls {
		m.spans[c.SpanID]++
	}
	return nil
}

func (m *memCalls) WriteOnce(ctx context.Context, b *export.Batch) error {
	m.mu.Lock()
	m.once++
	var rest export.Batch
	for _, c := range b.Calls {
		if m.spans[c.SpanID] == 0 {
			rest.Calls = append(rest.Calls, c)
		}
	}
	m.mu.Unlock()
	return m.Write(ctx, &rest)
}

// TestPipelineWALSurvivesKill: calls pushed into a pipeline whose sink hangs
// (so they wait in memory) are all stored once by the next pipeline on the
// same WAL; calls already stored before the "kill" are not stored twice.
func TestPipelineWALSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	sink1 := &memCalls{spans: map[string]int{}}
	w1 := openTestWAL(t, dir, WALConfig{})
	p1 := NewPipeline(Config{Workers: 1, FlushInterval: time.Millisecond, WAL: w1}, []NamedSink{{Name: "mem", Sink: sink1}}, metrics.New(), nil)
	push := func(p *Pipeline, seq uint64) {
		if !p.TryPush(streamPending(seq)) {
			t.Fatalf("call %d refused", seq)
		}
	}
	for i := range 10 {
		push(p1, uint64(i))
	}
	if err := p1.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The sink now hangs: the next calls wait in the pipeline when the
	// process is killed (p1 is abandoned, never closed).
	sink1.mu.Lock()
	sink1.block = make(chan struct{})
	sink1.mu.Unlock()
	for i := 10; i < 30; i++ {
		push(p1, uint64(i))
	}
	// A crash between a write and its acknowledgement: the WAL still holds
	// records 0..9 as unacknowledged in the next run only if their ack was
	// lost; simulate that by deleting the ack files.
	acks, _ := filepath.Glob(filepath.Join(dir, "*"+walAckSuffix))
	for _, a := range acks {
		os.Remove(a)
	}

	sink2 := &memCalls{spans: map[string]int{}}
	sink1.mu.Lock()
	for s, n := range sink1.spans { // what the store holds
		sink2.spans[s] = n
	}
	sink1.mu.Unlock()
	w2 := openTestWAL(t, dir, WALConfig{})
	p2 := NewPipeline(Config{Workers: 2, FlushInterval: time.Millisecond, WAL: w2}, []NamedSink{{Name: "mem", Sink: sink2}}, metrics.New(), nil)
	if err := p2.ReplayWAL(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		span := fmt.Sprintf("%016x", i)
		if n := sink2.spans[span]; n != 1 {
			t.Errorf("call %d stored %d times, want once", i, n)
		}
	}
	if sink2.once == 0 {
		t.Error("replayed rows were not written with WriteOnce")
	}
	// (p1 stays blocked: it is the killed process.)
}

// FuzzWALRecord: decoding any payload never panics, and a decoded record
// encodes back to a record that decodes to the same call.
func FuzzWALRecord(f *testing.F) {
	withEngine := pending(3)
	withEngine.Engine = engines.Replica{Kind: openai.KindVLLM, BaseURL: "http://127.0.0.1:8000/v1"}
	for _, p := range []*Pending{pending(1), streamPending(2), withEngine} {
		rec := appendWALRecord(nil, p, &walScratch{})
		f.Add(rec[walHeader:])
	}
	f.Add([]byte{walVersion, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte(strings.Repeat("\xff", 32)))
	f.Fuzz(func(t *testing.T, payload []byte) {
		decode := func(b []byte) (*Pending, error) {
			p := AcquirePending()
			p.keepRaw = true // keep the payloads, to encode them again
			return p, decodeWALRecord(b, p)
		}
		p, err := decode(payload)
		if err != nil {
			return
		}
		var a Assembler
		_ = Rows(p, &a)
		rec := appendWALRecord(nil, p, &walScratch{})
		q, err := decode(rec[walHeader:])
		if err != nil {
			t.Fatalf("a decoded record, encoded again, does not decode: %v", err)
		}
		if again := appendWALRecord(nil, q, &walScratch{}); string(again) != string(rec) {
			t.Fatal("decode and encode are not stable")
		}
	})
}

// TestWALConcurrentAppendSyncAck: appends from many goroutines, segment
// rotations, acknowledgements and the fsync loop at once (run with -race);
// everything acknowledged and closed leaves an empty folder.
func TestWALConcurrentAppendSyncAck(t *testing.T) {
	dir := t.TempDir()
	w := openTestWAL(t, dir, WALConfig{SegmentBytes: 4 << 10, SyncInterval: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var refs []walRef
			for i := range 100 {
				ref, err := w.append(appendWALRecord(nil, pending(uint64(g*1000+i)), &walScratch{}))
				if err != nil {
					t.Error(err)
					return
				}
				if refs = append(refs, ref); len(refs) == 10 {
					w.ack(refs)
					refs = nil
				}
			}
		}()
	}
	wg.Wait()
	if st := w.Stats(); st.Pending != 0 {
		t.Fatalf("%d records unacknowledged", st.Pending)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("files left: %d", len(left))
	}
}

// TestCommitOnce: a stream the WAL refused (full) at its end is not logged
// again, without its payloads, when TryPush runs; the refusal is counted once.
func TestCommitOnce(t *testing.T) {
	w := openTestWAL(t, t.TempDir(), WALConfig{MaxBytes: 64})
	p := NewPipeline(Config{WAL: w}, []NamedSink{{Name: "mem", Sink: &memCalls{spans: map[string]int{}}}}, metrics.New(), nil)
	c := streamPending(1)
	p.Commit(c)
	if !p.TryPush(c) {
		t.Fatal("call refused")
	}
	if got := testutil.ToFloat64(w.skippedFull); got != 1 {
		t.Fatalf("skipped (full) = %v, want 1", got)
	}
	if got := testutil.ToFloat64(w.logged); got != 0 {
		t.Fatalf("logged = %v, want 0", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
