package capture

import (
	"context"
	"errors"
	"fmt"
	"github.com/rollgate/rollgate/testkit/testenv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/internal/openai"
)

// gateSink blocks every write until release is closed, then records rows.
type gateSink struct {
	release chan struct{}
	rows    atomic.Int64
	fail    atomic.Int64 // writes left to fail
}

func (g *gateSink) Write(ctx context.Context, b *export.Batch) error {
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if g.fail.Add(-1) >= 0 {
		return errors.New("sink down")
	}
	g.rows.Add(int64(len(b.Calls)))
	return nil
}

func pending(seq uint64) *Pending {
	p := AcquirePending()
	p.Meta = export.Call{SpanID: "s", SequenceID: seq, HTTPStatus: 200, Endpoint: "/v1/chat/completions"}
	p.Endpoint = openai.ChatCompletions
	p.Body = append(p.Body[:0], `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop","token_ids":[5,6]}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4},"prompt_token_ids":[1,2]}`...)
	return p
}

// TestPipelineFullQueueCountsDrops fills a tiny queue behind a blocked sink:
// the overflow is refused, counted in metrics, and everything accepted is
// written once the sink recovers (after a failed first attempt).
func TestPipelineFullQueueCountsDrops(t *testing.T) {
	m := metrics.New()
	sink := &gateSink{release: make(chan struct{})}
	sink.fail.Store(1)
	p := NewPipeline(Config{QueueSize: 2, Workers: 1, BatchSize: 1, FlushInterval: time.Millisecond, Retries: 3},
		[]NamedSink{{Name: "gate", Sink: sink}}, m, nil)
	accepted, refused := 0, 0
	for i := range 50 {
		if p.TryPush(pending(uint64(i + 1))) {
			accepted++
		} else {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("a full queue accepted every call")
	}
	if got := testutil.ToFloat64(m.CaptureDropped); got != float64(refused) {
		t.Fatalf("rollgate_capture_dropped_total = %v, want %d", got, refused)
	}
	close(sink.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sink.rows.Load(); got != int64(accepted) {
		t.Fatalf("sink stored %d rows, want the %d accepted", got, accepted)
	}
	if got := testutil.ToFloat64(m.ExportErrors.WithLabelValues("gate")); got != 1 {
		t.Fatalf("export errors = %v, want 1 (the failed first attempt)", got)
	}
	if p.TryPush(pending(99)) {
		t.Fatal("a closed pipeline accepted a call")
	}
}

// TestRowsVerdict checks one assembled call end to end: rows per choice,
// bodies, and the token verdict.
func TestRowsVerdict(t *testing.T) {
	var a Assembler
	p := pending(1)
	p.Request = `{"model":"m","messages":[]}`
	rows := Rows(p, &a)
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	r := rows[0]
	if r.TokenSource != export.TokenSourceEngine || r.FinishReason != "stop" || len(r.ResponseTokenIDs) != 2 ||
		len(r.PromptTokenIDs) != 2 || r.PromptTokens != 2 || !strings.Contains(r.ResponseMessage, "hi") || r.RequestBody == "" {
		t.Fatalf("row: %+v", r)
	}
	// Usage disagreeing with the ids: not engine.
	p = pending(2)
	p.Body = []byte(strings.Replace(string(p.Body), `"completion_tokens":2`, `"completion_tokens":3`, 1))
	if r := Rows(p, &a)[0]; r.TokenSource == export.TokenSourceEngine || !strings.Contains(r.TokenCheck, "completion_count") {
		t.Fatalf("mismatch not flagged: %q %q", r.TokenSource, r.TokenCheck)
	}
	// Embeddings without bodies.
	p = pending(3)
	p.NoBodies = true
	if r := Rows(p, &a)[0]; r.RequestBody != "" || r.ResponseBody != "" {
		t.Fatalf("bodies stored despite NoBodies: %+v", r)
	}
}

// TestPipelineSync: Sync returns only once every call pushed before it is in
// the sink, without waiting for the (long) flush interval.
func TestPipelineSync(t *testing.T) {
	m := metrics.New()
	sink := &gateSink{release: make(chan struct{})}
	p := NewPipeline(Config{Workers: 2, BatchSize: 1000, FlushInterval: time.Hour}, []NamedSink{{Name: "gate", Sink: sink}}, m, nil)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Close(ctx)
	}()
	for i := range 20 {
		if !p.TryPush(pending(uint64(i + 1))) {
			t.Fatal("refused")
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := p.Sync(short)
	cancel()
	if err == nil {
		t.Fatal("Sync returned while the sink still held the rows")
	}
	close(sink.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sink.rows.Load(); got != 20 {
		t.Fatalf("after Sync the sink has %d rows, want 20", got)
	}
	if err := p.Sync(ctx); err != nil { // nothing new: returns at once
		t.Fatal(err)
	}
}

// TestPipelineDetokCheck: with a decoder set, rows whose ids decode to the
// returned text pass; a decoder that disagrees marks token_check "detok";
// both are counted by outcome.
func TestPipelineDetokCheck(t *testing.T) {
	for _, c := range []struct {
		name    string
		decoded string
		check   string
		outcome string
	}{{"match", "hi", "", "match"}, {"mismatch", "ho", "detok", "mismatch"}} {
		t.Run(c.name, func(t *testing.T) {
			m := metrics.New()
			var got []export.Call
			var mu sync.Mutex
			sink := sinkFunc(func(ctx context.Context, b *export.Batch) error {
				mu.Lock()
				got = append(got, b.Calls...)
				mu.Unlock()
				return nil
			})
			p := NewPipeline(Config{FlushInterval: time.Millisecond, Detok: func(engines.Replica) Detokenizer {
				return Detokenizer{Decode: func(_ context.Context, ids []uint32) ([]byte, error) { return []byte(c.decoded), nil }}
			}}, []NamedSink{{Name: "f", Sink: sink}}, m, nil)
			p.TryPush(pending(1))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].TokenCheck != c.check {
				t.Fatalf("rows %+v", got)
			}
			if v := testutil.ToFloat64(m.Detok.WithLabelValues(c.outcome)); v != 1 {
				t.Fatalf("rollgate_detok_total{outcome=%q} = %v", c.outcome, v)
			}
		})
	}
}

type sinkFunc func(ctx context.Context, b *export.Batch) error

func (f sinkFunc) Write(ctx context.Context, b *export.Batch) error { return f(ctx, b) }

// TestWorkerTakesQueuedCallsTogether: a worker woken from idle lingers, then
// takes every call queued meanwhile at once, so the batcher gets them in one
// message (here: one write of 5 rows, although BatchSize 1 writes each
// message as soon as it arrives) instead of one wake-up per call.
func TestWorkerTakesQueuedCallsTogether(t *testing.T) {
	m := metrics.New()
	var (
		mu     sync.Mutex
		writes []int
	)
	sink := sinkFunc(func(ctx context.Context, b *export.Batch) error {
		mu.Lock()
		writes = append(writes, len(b.Calls))
		mu.Unlock()
		return nil
	})
	// The worker's linger ends once all five calls are queued (a condition,
	// not a duration: a loaded machine may take longer than any linger to
	// push them).
	pushed := make(chan struct{})
	var lingered []time.Duration
	lingerSleep = func(d time.Duration) {
		lingered = append(lingered, d)
		<-pushed
	}
	idle := make(chan struct{}, 1)
	workerIdle = func() {
		select {
		case idle <- struct{}{}:
		default:
		}
	}
	defer func() { lingerSleep, workerIdle = time.Sleep, nil }()
	p := NewPipeline(Config{Workers: 1, BatchSize: 1, FlushInterval: time.Hour, Linger: 300 * time.Millisecond},
		[]NamedSink{{Name: "f", Sink: sink}}, m, nil)
	<-idle // the worker waits for work: the first push wakes it
	for i := range 5 {
		if !p.TryPush(pending(uint64(i + 1))) {
			t.Fatal("refused")
		}
	}
	close(pushed)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writes) != 1 || writes[0] != 5 {
		t.Fatalf("writes of %v rows, want one of 5", writes)
	}
	if len(lingered) != 1 || lingered[0] != 300*time.Millisecond {
		t.Fatalf("the worker lingered %v, want once for Config.Linger (300ms)", lingered)
	}
}

// TestPipelineQueueBytesBound: behind a blocked sink, calls are refused once
// the queued ones hold QueueBytes (long contexts), counted as drops, and
// everything accepted is written once the sink recovers. A call larger than
// the bound still enters an empty queue.
func TestPipelineQueueBytesBound(t *testing.T) {
	m := metrics.New()
	sink := &gateSink{release: make(chan struct{})}
	p := NewPipeline(Config{QueueBytes: 4000, Workers: 1, BatchSize: 1, FlushInterval: time.Millisecond},
		[]NamedSink{{Name: "gate", Sink: sink}}, m, nil)
	big := strings.Repeat("x", 1000)
	accepted, refused := 0, 0
	for i := range 100 {
		c := pending(uint64(i + 1))
		c.Request = `{"model":"m","messages":[{"role":"user","content":"` + big + `"}]}`
		if p.TryPush(c) {
			accepted++
		} else {
			refused++
		}
	}
	// The worker may hold a take of calls and the batcher one row while the
	// sink blocks; the queue itself holds at most 4000 bytes (3 calls).
	if refused == 0 || accepted > 3+maxTake {
		t.Fatalf("accepted %d, refused %d calls of ≈1.3 KB with a 4,000-byte queue", accepted, refused)
	}
	if got := testutil.ToFloat64(m.CaptureDropped); got != float64(refused) {
		t.Fatalf("rollgate_capture_dropped_total = %v, want %d", got, refused)
	}
	close(sink.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sink.rows.Load(); got != int64(accepted) {
		t.Fatalf("sink stored %d rows, want the %d accepted", got, accepted)
	}
	huge := pending(1000)
	huge.Request = strings.Repeat(" ", 10000) + `{}`
	if !p.TryPush(huge) {
		t.Fatal("a call larger than QueueBytes was refused by an empty queue")
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBatcherWritesAtBatchBytes: rows holding BatchBytes are written at
// once, without waiting for BatchSize rows or the flush interval.
func TestBatcherWritesAtBatchBytes(t *testing.T) {
	m := metrics.New()
	sink := &gateSink{release: make(chan struct{})}
	close(sink.release)
	p := NewPipeline(Config{BatchSize: 1000, BatchBytes: 1, FlushInterval: time.Hour}, []NamedSink{{Name: "gate", Sink: sink}}, m, nil)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Close(ctx)
	}()
	for i := range 3 {
		p.TryPush(pending(uint64(i + 1)))
	}
	testenv.WaitFor(t, 10*time.Second,
		func() string {
			return fmt.Sprintf("%d of 3 rows written: the batch was not written at BatchBytes", sink.rows.Load())
		},
		func() bool { return sink.rows.Load() >= 3 })
}
