package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize"
	"github.com/rollgate/rollgate/tokenize/hf"
)

// Pending is the raw material of one call, handed over by the gateway's hot
// path once the response is complete. Everything in it is owned by the
// pipeline after TryPush succeeds; get one with AcquirePending.
type Pending struct {
	// Meta carries the call's columns that do not depend on the choice:
	// attribution, sequence id, timings, endpoint, model, backend, status, error.
	Meta export.Call
	// Endpoint tells the assembler how to read the response.
	Endpoint openai.Endpoint
	// Request is the request body as the client sent it: a string, made by
	// the one copy of the client's bytes the gateway takes, that Rows puts
	// in request_body as it is.
	Request string
	// Body is the upstream response body of a non-streamed call (before any
	// stripping), or the error body the gateway returned itself.
	Body []byte
	// N is the request's "n" (choices asked for) when the gateway already
	// read it; 0: Rows reads it from Request (a pass over the whole body).
	N int
	// NoBodies leaves request_body and response_body empty in the rows
	// (embeddings are captured without bodies by default).
	NoBodies bool
	// Engine is the replica that served the call (its engine kind and base
	// URL; zero: none known): the id fallback and the detokenisation check
	// use its engine's tokenizer endpoints (Config.Fallback, Config.Detok).
	Engine engines.Replica
	// IDs are the call's span, trace and parent span ids as lowercase hex,
	// written by the gateway without allocating; capture copies them into
	// Meta.SpanID, TraceID and ParentSpanID off the hot path.
	IDs CallIDs

	// A streamed response is assembled event by event as it arrives (asm),
	// so its payloads need not be kept until the stream ends. Only payloads
	// that may carry logprobs are kept, for the token-id fallback.
	asm       Assembler
	nEvents   int    // payloads recorded with AddEvent
	events    []byte // kept payloads, concatenated
	eventEnds []int  // end offset of each kept payload in events
	ticket    uint64 // order of TryPush, for Sync
	size      int    // bytes counted against Config.QueueBytes while queued

	// With a WAL (Config.WAL), every payload of a stream is kept in raw
	// for the call's WAL record (see walcodec.go), and wal names the record
	// once it is logged (walLogged). again marks a call replayed from the
	// WAL at start: its rows may be stored already (export.WriteAgain).
	keepRaw   bool
	raw       []byte
	rawEnds   []int
	wal       walRef
	walLogged bool
	walTried  bool // Commit ran (logged or refused)
	again     bool
	// rows are the call's rows when it was replayed from a rows record
	// (walVersionRows): assembled and redacted before the kill.
	rows []export.Call
}

// footprint is what a queued call holds in memory, roughly: its bodies,
// kept payloads and, for a stream, what its assembler has gathered.
func (p *Pending) footprint() int {
	n := len(p.Request) + len(p.Body) + len(p.events) + len(p.raw)
	for i := range p.rows {
		n += rowBytes(&p.rows[i])
	}
	if p.nEvents > 0 {
		n += p.asm.footprint()
	}
	return n
}

// CallIDs are W3C ids as lowercase hex in fixed arrays (see Pending.IDs).
type CallIDs struct {
	Span      [16]byte
	Trace     [32]byte
	Parent    [16]byte
	Set       bool // Span and Trace hold ids
	HasParent bool // Parent holds an id
}

// ResolveIDs copies IDs into Meta's string columns where those are empty.
func (p *Pending) ResolveIDs() {
	if !p.IDs.Set {
		return
	}
	if p.Meta.SpanID == "" {
		p.Meta.SpanID = string(p.IDs.Span[:])
	}
	if p.Meta.TraceID == "" {
		p.Meta.TraceID = string(p.IDs.Trace[:])
	}
	if p.Meta.ParentSpanID == "" && p.IDs.HasParent {
		p.Meta.ParentSpanID = string(p.IDs.Parent[:])
	}
}

var pendingPool = sync.Pool{New: func() any { return new(Pending) }}

// AcquirePending returns an empty Pending from a pool.
func AcquirePending() *Pending { return pendingPool.Get().(*Pending) }

// releasePending resets p and returns it to the pool. Very large buffers are
// not pooled, so one huge response does not pin memory.
// ReleasePending returns a Pending that will not be captured (a call refused
// before it was admitted) to the pool. p must not be used afterwards.
func ReleasePending(p *Pending) { releasePending(p) }

func releasePending(p *Pending) {
	const maxPooled = 1 << 20
	if cap(p.Body) > maxPooled || cap(p.events) > maxPooled || cap(p.raw) > maxPooled ||
		(p.nEvents > 0 && p.asm.footprint() > maxPooled) {
		return
	}
	p.reset()
	pendingPool.Put(p)
}

// reset empties p for its next call, keeping its buffers.
func (p *Pending) reset() {
	p.Meta = export.Call{}
	p.Endpoint = 0
	p.NoBodies = false
	p.N = 0
	p.IDs = CallIDs{}
	p.Request = ""
	p.Body = p.Body[:0]
	p.events = p.events[:0]
	p.eventEnds = p.eventEnds[:0]
	p.nEvents = 0
	p.ticket = 0
	p.keepRaw, p.walLogged, p.walTried, p.again = false, false, false, false
	p.raw, p.rawEnds = p.raw[:0], p.rawEnds[:0]
	p.wal = walRef{}
	p.rows = nil
	p.asm.release()
}

// AddEvent records the data payload of one streamed SSE event. Set Endpoint
// first and call it in the stream's order. The payload is assembled at once
// (see Assembler.AddChunk) and not kept, except when it may carry logprobs:
// those payloads are copied for the token-id fallback, which reads output
// ids from logprobs entries. data is not retained.
func (p *Pending) AddEvent(data []byte) {
	if p.nEvents == 0 {
		p.asm.Reset(p.Endpoint)
	}
	p.nEvents++
	if p.keepRaw {
		p.raw = append(p.raw, data...)
		p.rawEnds = append(p.rawEnds, len(p.raw))
	}
	keep := p.asm.addChunk(data)
	switch {
	case p.asm.noLogprobIDs:
		// The token-id fallback cannot complete this call's output from its
		// logprobs (see Assembler.noLogprobIDs): nothing kept is of use.
		p.events, p.eventEnds = p.events[:0], p.eventEnds[:0]
	case keep:
		p.events = append(p.events, data...)
		p.eventEnds = append(p.eventEnds, len(p.events))
	}
}

// Head returns the bytes that opened the last assembled stream chunk before
// its "choices" member, when the members before it were only id, object,
// created and model: the head vLLM and SGLang repeat in every chunk of a
// chat or completions stream (see Assembler.head). nil when there is none.
// The gateway's stripper skips these bytes in a chunk that starts with them
// (rewrite.StripEventHead) instead of walking them again. The slice is
// owned by p and valid until the next AddEvent.
func (p *Pending) Head() []byte {
	if p.nEvents == 0 || len(p.asm.head) == 0 {
		return nil
	}
	return p.asm.head
}

// Streamed reports whether events were recorded.
func (p *Pending) Streamed() bool { return p.nEvents > 0 }

// eachEvent calls f with every kept payload in order: every payload from
// which tokenize/fallback.LogprobIDs could read ids (see Assembler.addChunk),
// or none once a choice of the call has a logprobs entry without an id (the
// fallback's output side fails for the call then, see
// Assembler.noLogprobIDs).
func (p *Pending) eachEvent(f func(data []byte)) {
	start := 0
	for _, end := range p.eventEnds {
		f(p.events[start:end])
		start = end
	}
}

// IDFiller completes missing or miscounted token ids of one call's rows
// after the fact (tokenize/fallback.Client: the backend's /tokenize, ids in
// logprobs). payloads calls its argument with the non-streamed response body,
// or with every kept SSE data payload in order. The pipeline counts a call
// as filled unless Fill returns an error or an outcome with Skipped set.
type IDFiller interface {
	Fill(ctx context.Context, rows []export.Call, request []byte, payloads func(func(data []byte))) (tokenize.FillOutcome, error)
}

// NamedSink is a sink with the name used in metrics and logs.
type NamedSink struct {
	Name string
	Sink export.Sink
}

// Config sizes the capture pipeline. Zero values take the documented defaults.
type Config struct {
	// QueueSize is how many completed calls may wait for assembly (default 8192).
	// When full, TryPush returns false and the call is counted as dropped.
	QueueSize int `yaml:"queue_size"`
	// QueueBytes bounds the memory of the calls waiting for assembly
	// (default 256 MiB): with long agent contexts a call is 100 KB or more,
	// so QueueSize calls alone could take gigabytes when the store falls
	// behind. Past it, TryPush refuses calls as when QueueSize is reached.
	QueueBytes int `yaml:"queue_bytes"`
	// BatchBytes makes the batcher write as soon as its rows hold this many
	// bytes of bodies and ids (default 32 MiB), before BatchSize rows: a
	// batch of 1,000 calls with long contexts would be hundreds of MiB, and
	// a store's encoding of it as much again.
	BatchBytes int `yaml:"batch_bytes"`
	// Linger is how long a worker woken from idle waits before taking the
	// calls queued, so that it takes several at once instead of being woken
	// for every call (default 2ms; negative = do not wait). Under load the
	// workers are never idle and never wait.
	Linger time.Duration `yaml:"-"`
	// Workers assemble calls into rows (default 2).
	Workers int `yaml:"workers"`
	// BatchSize is the number of rows that triggers a write (default 1000).
	BatchSize int `yaml:"batch_size"`
	// FlushInterval is the longest a row waits before being written (default 200ms).
	FlushInterval time.Duration `yaml:"flush_interval"`
	// Fallback, when set, returns the id filler for the engine replica that
	// served a call (Pending.Engine; nil: none), usually EngineFiller. It
	// runs for calls whose engine ids are missing or failed a check, off the
	// hot path, before the rows are written.
	Fallback func(r engines.Replica) IDFiller `yaml:"-"`
	// Detok, when set, turns on the detokenisation check: it returns the
	// decoder for the engine replica that served a call (Decode nil: no
	// check), EngineDetok or LocalDetok.
	Detok func(r engines.Replica) Detokenizer `yaml:"-"`
	// Redact rewrites stored text (bodies, messages) before rows reach any
	// sink; nil = no redaction.
	Redact *Redactor `yaml:"-"`
	// Retries is how many times a failed batch write is retried, with
	// exponential backoff from 100ms, before its rows are dropped and counted (default 5).
	Retries int `yaml:"-"`
	// WAL, when set, logs every finished call before its answer completes
	// and replays what an earlier, killed process left (see WAL and
	// Pipeline.ReplayWAL); the pipeline closes it. nil = calls waiting in
	// the queue are lost when the process is killed.
	WAL *WAL `yaml:"-"`
}

func (c *Config) setDefaults() {
	if c.QueueSize <= 0 {
		c.QueueSize = 8192
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = 256 << 20
	}
	if c.BatchBytes <= 0 {
		c.BatchBytes = 32 << 20
	}
	if c.Linger == 0 {
		c.Linger = 2 * time.Millisecond
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 200 * time.Millisecond
	}
	if c.Retries <= 0 {
		c.Retries = 5
	}
}

// Pipeline moves completed calls off the hot path: a bounded queue, workers
// that assemble rows, and a batcher that writes them to every sink.
//
// The queue is a slice under a mutex rather than a channel: TryPush appends
// and wakes an idle worker only when the queue was empty, and a woken worker
// lingers (Config.Linger) and then takes every queued call at once, handing
// the batcher one message per take. With a channel per call and per row,
// each call woke a worker and the batcher (a futex and a context switch
// each), and at low load those wake-ups competed with the calls in flight
// for the CPU.
type Pipeline struct {
	cfg   Config
	sinks []NamedSink
	m     *metrics.Metrics
	log   *slog.Logger

	qmu   sync.Mutex
	queue []*Pending    // calls waiting for a worker, oldest first
	qsize int           // their footprints (Pending.size)
	wake  chan struct{} // an idle worker is woken through it
	quit  chan struct{} // closed by Close: workers finish the queue and stop
	rows  chan rowBatch
	wg    sync.WaitGroup // workers
	done  chan struct{}  // batcher finished

	// Sync: every pushed call takes a ticket; a ticket is settled once its
	// rows were written (or dropped); watermark is the highest ticket below
	// which all are settled.
	tickets   atomic.Uint64
	settleMu  sync.Mutex
	watermark uint64
	settled   map[uint64]struct{}
	flushReq  chan struct{}

	mu     sync.RWMutex
	closed bool

	turns *tokenize.Tracker

	replay replayState // ReplayWAL's end (walpipe.go)
}

// Detokenizer decodes output ids into text for the detokenisation check:
// an engine's /detokenize or a local tokenizer. Special, when not nil, marks
// ids the engine does not render (end of turn), dropped before comparing.
type Detokenizer struct {
	Decode  func(ctx context.Context, ids []uint32) ([]byte, error)
	Special func(id uint32) bool
}

// EngineFiller is the id filler of replica r's engine (its tokenizer
// endpoints, engines.Tokenizing); nil when the engine has none.
func EngineFiller(r engines.Replica) IDFiller {
	if f := engines.Filler(r.Kind, r.BaseURL); f != nil {
		return f
	}
	return nil
}

// EngineDetok is the decoder of replica r's engine (engines.Detokenizing:
// vLLM's /detokenize); Decode nil when the engine has none.
func EngineDetok(r engines.Replica) Detokenizer {
	return Detokenizer{Decode: engines.Detokenizer(r.Kind, r.BaseURL)}
}

// LocalDetok is the decoder of a local tokenizer, whichever replica
// served the call.
func LocalDetok(tk *hf.Tokenizer) func(engines.Replica) Detokenizer {
	d := Detokenizer{Decode: func(_ context.Context, ids []uint32) ([]byte, error) { return tk.DecodeBytes(ids) }, Special: tk.IsSpecial}
	return func(engines.Replica) Detokenizer { return d }
}

// UseEngines sets Fallback and Detok as the gateway's settings say:
// Fallback is EngineFiller unless noFallback (disable_tokenize_fallback);
// detokCheck (detok_check) "" leaves the check off, "engine" uses
// EngineDetok, anything else is the path of a tokenizer.json (LocalDetok).
func (c *Config) UseEngines(noFallback bool, detokCheck string) error {
	c.Fallback, c.Detok = nil, nil
	if !noFallback {
		c.Fallback = EngineFiller
	}
	switch detokCheck {
	case "":
	case "engine":
		c.Detok = EngineDetok
	default:
		tk, err := hf.LoadFile(detokCheck)
		if err != nil {
			return fmt.Errorf("detok_check tokenizer: %w", err)
		}
		c.Detok = LocalDetok(tk)
	}
	return nil
}

// checkDetok decodes the rows' engine ids and compares them with the text
// returned; a mismatch adds "detok" to token_check. Counted in
// rollgate_detok_total by outcome.
func (p *Pipeline) checkDetok(engine engines.Replica, rows []export.Call) {
	if p.cfg.Detok == nil || len(rows) == 0 {
		return
	}
	if src := rows[0].TokenSource; src != export.TokenSourceEngine && src != export.TokenSourceTokenize {
		return
	}
	d := p.cfg.Detok(engine)
	if d.Decode == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep := tokenize.CheckDetokenization(rows, func(ids []uint32) ([]byte, error) { return d.Decode(ctx, ids) }, d.Special)
	for i, r := range rep.Rows {
		p.m.Detok.WithLabelValues(r.Outcome).Inc()
		if r.Outcome == tokenize.DetokMismatch || r.Outcome == tokenize.DetokDecodeError {
			if rows[i].TokenCheck != "" {
				rows[i].TokenCheck += ","
			}
			rows[i].TokenCheck += "detok"
		}
	}
}

// NewPipeline starts the workers and the batcher.
func NewPipeline(cfg Config, sinks []NamedSink, m *metrics.Metrics, log *slog.Logger) *Pipeline {
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	p := &Pipeline{
		cfg:      cfg,
		sinks:    sinks,
		m:        m,
		log:      log,
		wake:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		rows:     make(chan rowBatch, cfg.Workers),
		done:     make(chan struct{}),
		settled:  map[uint64]struct{}{},
		flushReq: make(chan struct{}, 1),
		turns:    tokenize.NewTracker(tokenize.TurnOptions{}, 0),
	}
	m.CaptureQueueCapacity.Set(float64(cfg.QueueSize))
	for range cfg.Workers {
		p.wg.Add(1)
		go p.work()
	}
	go p.batch()
	return p
}

// TryPush hands a completed call to the pipeline without blocking. It returns
// false, counts the drop and logs it when the queue is full or closed; the
// caller keeps ownership of c in that case.
//
// With a WAL (Config.WAL) the call is logged first (see Commit), so that a
// process kill from here on loses nothing of it.
func (p *Pipeline) TryPush(c *Pending) bool {
	p.Commit(c)
	if p.enqueue(c) {
		return true
	}
	if c.walLogged { // dropped and counted below: nothing to replay
		p.cfg.WAL.ack([]walRef{c.wal})
	}
	p.m.CaptureDropped.Inc()
	c.ResolveIDs()
	p.log.Warn("capture queue full: call not captured (raise --capture-queue / --capture-queue-bytes or add export capacity)",
		"rollout_id", c.Meta.RolloutID, "sequence_id", c.Meta.SequenceID, "span_id", c.Meta.SpanID,
		"queue_size", p.cfg.QueueSize, "queue_bytes", p.cfg.QueueBytes, "call_bytes", c.size)
	return false
}

// enqueue queues c unless the queue is full or closed; it neither counts
// nor logs a refusal.
func (p *Pipeline) enqueue(c *Pending) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if !p.closed {
		c.ticket = p.tickets.Add(1)
		c.size = c.footprint()
		p.qmu.Lock()
		n := len(p.queue)
		// One call larger than QueueBytes still goes into an empty queue.
		fits := n < p.cfg.QueueSize && (n == 0 || p.qsize+c.size <= p.cfg.QueueBytes)
		if fits {
			p.queue = append(p.queue, c)
			p.qsize += c.size
		}
		p.qmu.Unlock()
		if fits {
			p.m.CaptureQueueDepth.Set(float64(n + 1))
			if n == 0 { // the workers may all be idle
				select {
				case p.wake <- struct{}{}:
				default: // a wake-up is pending already
				}
			}
			return true
		}
		p.settle(c.ticket)
	}
	return false
}

// Close stops accepting calls, assembles and writes everything queued, and
// returns once the sinks have it or ctx ends.
func (p *Pipeline) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.quit)
	p.mu.Unlock()
	go func() { p.wg.Wait(); close(p.rows) }()
	select {
	case <-p.done:
		if p.cfg.WAL != nil {
			return p.cfg.WAL.Close()
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("capture: flushing on close: %w", ctx.Err())
	}
}

// maxTake and maxTakeBytes bound what one worker takes at once (at least one
// call), so that the other workers share a long queue, and so that the rows
// between the workers and the batcher (a take being assembled per worker,
// and one waiting per worker) stay within a few times maxTakeBytes even when
// calls carry long contexts.
const (
	maxTake      = 256
	maxTakeBytes = 8 << 20
)

// take moves up to maxTake of the oldest queued calls into dst.
func (p *Pipeline) take(dst []*Pending) []*Pending {
	p.qmu.Lock()
	n, size := 0, 0
	for n < len(p.queue) && n < maxTake && (n == 0 || size < maxTakeBytes) {
		size += p.queue[n].size
		n++
	}
	dst = append(dst, p.queue[:n]...)
	p.qsize -= size
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	p.qmu.Unlock()
	p.m.CaptureQueueDepth.Set(float64(rest))
	if rest > 0 { // more than this worker takes: let another help
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return dst
}

// Test hooks: lingerSleep is how a woken worker lingers, workerIdle (when
// set) runs each time a worker finds the queue empty and waits; tests replace
// them to wait on conditions instead of durations.
var (
	lingerSleep = time.Sleep
	workerIdle  func()
)

func (p *Pipeline) work() {
	defer p.wg.Done()
	var (
		a     Assembler
		calls []*Pending
	)
	for {
		calls = p.take(calls[:0])
		if len(calls) == 0 {
			if workerIdle != nil {
				workerIdle()
			}
			select {
			case <-p.wake:
				if p.cfg.Linger > 0 {
					lingerSleep(p.cfg.Linger)
				}
				continue
			case <-p.quit:
				// Nothing is pushed any more: finish what is queued.
				if calls = p.take(calls[:0]); len(calls) == 0 {
					return
				}
			}
		}
		p.rows <- p.assemble(calls, &a)
		clear(calls)
	}
}

// assemble turns calls into rows for the batcher and releases them.
func (p *Pipeline) assemble(calls []*Pending, a *Assembler) rowBatch {
	var out rowBatch
	out.tickets = make([]uint64, 0, len(calls))
	for _, c := range calls {
		rows := p.callRows(c, a)
		for i := range rows {
			out.bytes += rowBytes(&rows[i])
		}
		out.rows = append(out.rows, rows...)
		out.tickets = append(out.tickets, c.ticket)
		if c.walLogged {
			out.wal = append(out.wal, c.wal)
		}
		out.again = out.again || c.again
		releasePending(c)
	}
	return out
}

// callRows assembles, completes, checks and redacts the rows of one call.
// A panic while doing so (a defect, or a replayed record no build can
// process) drops the call instead of the process: it is counted in
// rollgate_capture_dropped_total and logged, and its WAL record is set
// aside (a quarantine file; see WAL.setAside) so that no restart replays it
// again.
func (p *Pipeline) callRows(c *Pending, a *Assembler) (rows []export.Call) {
	defer func() {
		if v := recover(); v != nil {
			err := fmt.Errorf("capture: assembling a call panicked: %v", v)
			p.m.CaptureDropped.Inc()
			p.log.Error("capture: call dropped: its assembly panicked", "rollout_id", c.Meta.RolloutID, "span_id", c.Meta.SpanID,
				"replayed", c.again, "err", err, "stack", string(debug.Stack()))
			if c.walLogged {
				p.cfg.WAL.setAside(c.wal, err)
				c.walLogged = false // acknowledged by setAside
			}
			rows = nil
		}
	}()
	if c.rows != nil {
		rows = c.rows // replayed from a rows record: no raw request or payloads for the fallback
	} else {
		rows = Rows(c, a)
		p.fill(c, rows)
	}
	p.checkDetok(c.Engine, rows)
	p.checkTurn(rows)
	if len(rows) > 0 && rows[0].PromptTokens+rows[0].CompletionTokens > 0 {
		model := metrics.ModelLabel(rows[0].Model)
		p.m.Tokens.WithLabelValues(model, "prompt").Add(float64(rows[0].PromptTokens))
		p.m.Tokens.WithLabelValues(model, "completion").Add(float64(rows[0].CompletionTokens))
	}
	for i := range rows {
		p.cfg.Redact.Apply(&rows[i], p.redactHit)
	}
	for _, row := range rows {
		p.m.TokenIDs.WithLabelValues(row.TokenSource).Inc()
	}
	p.m.CapturedRows.Add(float64(len(rows)))
	return rows
}

func (p *Pipeline) redactHit(rule string) { p.m.Redactions.WithLabelValues(rule).Inc() }

// checkTurn records how this call's prompt ids continue the previous call
// of the same rollout attempt (tokenize.Tracker): the turn_* columns.
func (p *Pipeline) checkTurn(rows []export.Call) {
	if len(rows) == 0 || rows[0].RolloutID == "" || (!openai.ChatShaped(rows[0].Endpoint) && rows[0].Endpoint != "/v1/completions") {
		return
	}
	t := p.turns.Observe(rows)
	for i := range rows {
		rows[i].TurnKind = t.Kind
		rows[i].TurnPrefixLen = uint32(t.PrefixLen)
		rows[i].TurnPrevSequenceID = t.PrevSequenceID
	}
	p.m.Turns.WithLabelValues(t.Kind).Inc()
}

// fill runs the configured id fallback for a call whose engine ids are not verified.
func (p *Pipeline) fill(c *Pending, rows []export.Call) {
	if p.cfg.Fallback == nil || len(rows) == 0 || rows[0].TokenSource == export.TokenSourceEngine ||
		rows[0].Error != "" || rows[0].HTTPStatus >= 300 {
		return
	}
	f := p.cfg.Fallback(c.Engine)
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A copy: the filler gets bytes it may keep or change, not a view of
	// the rows' request_body.
	out, err := f.Fill(ctx, rows, []byte(c.Request), func(fn func([]byte)) {
		if c.Streamed() {
			c.eachEvent(fn)
		} else {
			fn(c.Body)
		}
	})
	switch {
	case err != nil && (out.Prompt || out.Output):
		// One side completed and kept (prompt_/response_token_source).
		p.m.TokenFallback.WithLabelValues("partial").Inc()
		p.log.Debug("token id fallback completed one side only", "backend", rows[0].Backend, "span_id", rows[0].SpanID, "err", err)
	case err != nil:
		p.m.TokenFallback.WithLabelValues("failed").Inc()
		p.log.Debug("token id fallback failed", "backend", rows[0].Backend, "span_id", rows[0].SpanID, "err", err)
	case out.Skipped:
	default:
		p.m.TokenFallback.WithLabelValues("filled").Inc()
	}
}

func (p *Pipeline) batch() {
	defer close(p.done)
	t := time.NewTicker(p.cfg.FlushInterval)
	defer t.Stop()
	b := &export.Batch{Calls: make([]export.Call, 0, p.cfg.BatchSize)}
	var (
		done  []uint64 // tickets of the calls whose rows are all in b
		refs  []walRef // their WAL records
		size  int      // rowBytes of b.Calls
		again bool     // b holds rows replayed from the WAL
	)
	flush := func() {
		if len(b.Calls) > 0 {
			p.write(b, again)
			clear(b.Calls) // drop the rows' bodies now, not when the slots are reused
			b.Calls = b.Calls[:0]
		}
		size, again = 0, false
		if len(refs) > 0 { // the rows are in the sinks (or the spool), or dropped and counted
			p.cfg.WAL.ack(refs)
			refs = refs[:0]
		}
		p.settle(done...)
		done = done[:0]
	}
	for {
		select {
		case m, ok := <-p.rows:
			if !ok {
				flush()
				return
			}
			b.Calls = append(b.Calls, m.rows...)
			done = append(done, m.tickets...)
			refs = append(refs, m.wal...)
			again = again || m.again
			size += m.bytes
			if len(b.Calls) >= p.cfg.BatchSize || size >= p.cfg.BatchBytes {
				flush()
			}
		case <-t.C:
			flush()
		case <-p.flushReq:
			flush()
		}
	}
}

// rowBatch carries the rows of the calls one worker took to the batcher,
// with those calls' tickets (settled once the rows are written).
type rowBatch struct {
	rows    []export.Call
	tickets []uint64
	bytes   int      // rowBytes of rows
	wal     []walRef // WAL records of the calls, acknowledged once the rows are written
	again   bool     // some calls were replayed from the WAL: write with export.WriteAgain
}

// rowBytes is roughly what a row holds: its bodies, message and id arrays.
func rowBytes(r *export.Call) int {
	return len(r.RequestBody) + len(r.ResponseBody) + len(r.ResponseMessage) +
		4*(len(r.PromptTokenIDs)+len(r.ResponseTokenIDs)+len(r.ResponseLogprobs))
}

// settle marks tickets as written (or dropped) and advances the watermark.
func (p *Pipeline) settle(tickets ...uint64) {
	if len(tickets) == 0 {
		return
	}
	p.settleMu.Lock()
	for _, t := range tickets {
		p.settled[t] = struct{}{}
	}
	for {
		if _, ok := p.settled[p.watermark+1]; !ok {
			break
		}
		delete(p.settled, p.watermark+1)
		p.watermark++
	}
	p.settleMu.Unlock()
}

// Sync waits until every call handed to TryPush before it was called has
// been written to the sinks (or dropped and counted), flushing the current
// batch early instead of waiting for the flush interval. The API uses it so
// that a rollout reported finished already has its calls stored.
func (p *Pipeline) Sync(ctx context.Context) error {
	target := p.tickets.Load()
	for {
		p.settleMu.Lock()
		ok := p.watermark >= target
		p.settleMu.Unlock()
		if ok {
			return nil
		}
		select {
		case p.flushReq <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("capture: waiting for calls to be stored: %w", ctx.Err())
		case <-p.done:
			return errors.New("capture: pipeline closed before the calls were stored")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// write stores b in every sink, retrying with backoff; rows a sink never
// accepts are counted as dropped and logged. again: b holds rows replayed
// from the WAL, which may be stored already, so even the first try goes
// through export.WriteAgain.
func (p *Pipeline) write(b *export.Batch, again bool) {
	for _, s := range p.sinks {
		var err error
		backoff := 100 * time.Millisecond
		for attempt := 0; attempt <= p.cfg.Retries; attempt++ {
			if attempt > 0 {
				time.Sleep(backoff)
				backoff *= 2
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if attempt == 0 && !again {
				err = s.Sink.Write(ctx, b)
			} else {
				err = export.WriteAgain(ctx, s.Sink, b) // the failed try may have stored some rows
			}
			cancel()
			p.m.ExportDuration.WithLabelValues(s.Name).Observe(time.Since(start).Seconds())
			if err == nil {
				p.m.ExportBatches.WithLabelValues(s.Name, "ok").Inc()
				p.m.ExportRows.WithLabelValues(s.Name, "llm_calls").Add(float64(len(b.Calls)))
				break
			}
			p.m.ExportBatches.WithLabelValues(s.Name, "error").Inc()
			p.m.ExportErrors.WithLabelValues(s.Name).Inc()
			p.log.Warn("export: batch write failed", "sink", s.Name, "rows", b.Len(), "attempt", attempt+1, "err", err)
			if errors.Is(err, spool.ErrFull) || errors.Is(err, spool.ErrClosed) {
				break // the spool counted its drop; retrying would only stall the batcher
			}
		}
		if err != nil {
			p.m.ExportDropped.WithLabelValues(s.Name).Add(float64(b.Len()))
			p.log.Error("export: rows dropped after retries (enable --spool-dir to keep them through sink outages)", "sink", s.Name,
				"rows", b.Len(), "err", err)
		}
	}
}
