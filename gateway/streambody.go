package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/openai"
)

// streamBody is the client's copy of a streamed (SSE) backend response.
// Each fill that finds nothing pending reads the backend once (a burst: what
// arrived together), hands the events to capture, strips what the gateway
// injected and leaves the client's bytes in out. writeStream writes them on
// the hijacked client connection, a chunk per burst in one write
// (streamconn.go); a stream a wrapper translates (Anthropic's /v1/messages)
// is an io.Reader fasthttp pulls from instead (Read). Either way it needs no
// pipe, no per-chunk channel hand-off, and allocates nothing per call
// (streamBody values are pooled).
//
// CloseWithError is called exactly once, after the last chunk or after a
// failed write to the client; that ends the call: the backend response is
// released (or aborted when the client went away) and the call is captured.
type streamBody struct {
	s    *Server
	c    call
	resp *fasthttp.Response
	inj  rewrite.Injected
	r    *backends.Upstream // released, with the concurrency slot, when the call ends

	upstream io.Reader
	es       *engineStream // upstream, when the gateway reads its chunks: it tells what is buffered
	sc       capture.SSEScanner
	in       []byte       // backend read buffer (from streamIns; while waiting for the backend, only when es is nil)
	one      [1]byte      // what a stream waits on instead (readBurst)
	outBuf   *streamOut   // out and scratch come from it; nil while waiting for the backend (takeOut, putOut)
	out      []byte       // bytes for the client, out[off:] not yet returned
	scratch  []byte       // StripEvent output
	head     rewrite.Head // the chunks' repeated head, as capture found it: the stripper skips it
	fp       fpHold       // finish chunks waiting for the dropped usage chunk's system_fingerprint
	held     []byte       // data payloads forwarded but not yet handed to capture (from outBuf)
	heldEnds []int        // end offset of each payload in held
	sawData  bool         // the backend sent an event with data
	off      int
	first    bool
	eof      bool  // the backend stream ended (or failed, see rerr)
	rerr     error // backend read error other than io.EOF
	closed   bool
	bodyRdr  bytes.Reader
	done     bool      // the backend sent data: [DONE]
	errEvent bool      // the backend sent an error event
	respEnd  bool      // the backend sent a Responses stream's last event (see isResponseEnd)
	conn     net.Conn  // the client connection, for write deadlines
	deadline time.Time // when the write deadline was last moved

	// Written on the hijacked connection (streamconn.go): what the end of
	// the stream needs, kept here because the stream may end on another
	// goroutine than the one it began on (park).
	respHead   *[]byte              // the response headers, until they leave with the first chunk (from streamHeadBufs)
	ahead      []byte               // the client's bytes read ahead of the stream (readAhead)
	closeAfter bool                 // the connection closes after the stream
	ctx        *fasthttp.RequestCtx // the hijacked request's; nil once parked (fasthttp then released it)
	// park's: the stream's key among the parked, its deadline, whether its
	// timer resumed it (all under the parker's lock), and the timer (made at
	// the first park of this pooled value, kept with it).
	parkKey        uint64
	parkDue        time.Time
	parkExpiredNow bool
	parkTimer      *time.Timer
	parkTimerAt    time.Time // when parkTimer fires; zero: stopped
	resumed        bool      // woken from a park: the next fill reads (what woke it is there)
	onWorker       bool      // running on a parker's worker: it must block nowhere but in writes to the client (parker.enterWrite)
}

// errParked is what writeStream returns when the stream was parked: it is
// another goroutine's from then on.
var errParked = errors.New("stream parked")

// maxBurstRead bounds the backend read buffer a burst grows it to (see fill).
const maxBurstRead = 32 << 10

var streamBodies = sync.Pool{New: func() any { return new(streamBody) }}

// streamIns are backend read buffers. A small one: an SSE event is a few
// hundred bytes. It grows for a burst (readBurst), up to maxBurstRead. A
// stream read by an engineStream takes one only once the backend's next
// bytes are in: 1,000 streams between tokens hold none (nor, when the
// engineStream can wait without it, the connection's read buffer).
var streamIns = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

// takeIn gives b a read buffer.
func (b *streamBody) takeIn() {
	if b.in == nil {
		b.in = *streamIns.Get().(*[]byte)
	}
}

// putIn gives b's read buffer back.
func (b *streamBody) putIn() {
	if b.in != nil {
		in := b.in
		b.in = nil
		streamIns.Put(&in)
	}
}

// streamOut is a stream's output: the client bytes of one fill (out), the
// stripper's output for one event (scratch) and the payloads of one fill
// held for capture (held, heldEnds). A stream holds one only from a backend
// read's return until its bytes are taken and its payloads handed to
// capture (putOut), not while it waits for the backend: most of an open
// stream's life, so 1,000 streams between tokens hold none.
type streamOut struct {
	out, scratch, held []byte
	heldEnds           []int
}

// maxPooledOut is the largest buffer of a streamOut put back into streamOuts.
const maxPooledOut = 256 << 10

var streamOuts = sync.Pool{New: func() any {
	// out and scratch grow when needed.
	return &streamOut{out: make([]byte, 0, 4<<10), scratch: make([]byte, 0, 1<<10)}
}}

// takeOut gives b an output buffer, empty but for the room of a chunk's
// size line (chunkRoom).
func (b *streamBody) takeOut() {
	if b.outBuf == nil {
		b.outBuf = streamOuts.Get().(*streamOut)
	}
	b.out, b.off = b.outBuf.out[:chunkRoom], chunkRoom
	b.scratch = b.outBuf.scratch[:0]
	b.held, b.heldEnds = b.outBuf.held[:0], b.outBuf.heldEnds[:0]
}

// putOut gives b's output buffer back once every byte in it was taken and
// the held payloads were handed to capture (handHeld).
func (b *streamBody) putOut() {
	o := b.outBuf
	if o == nil {
		return
	}
	o.out, o.scratch, o.held, o.heldEnds = b.out[:0], b.scratch[:0], b.held[:0], b.heldEnds[:0]
	b.outBuf, b.out, b.scratch, b.held, b.heldEnds, b.off = nil, nil, nil, nil, nil, 0
	if cap(o.out) <= maxPooledOut && cap(o.scratch) <= maxPooledOut && cap(o.held) <= maxPooledOut {
		streamOuts.Put(o)
	}
}

// newStreamBody takes a pooled streamBody for resp.
func (s *Server) newStreamBody(c *call, resp *fasthttp.Response, inj rewrite.Injected, r *backends.Upstream, conn net.Conn) *streamBody {
	b := streamBodies.Get().(*streamBody)
	b.s, b.c, b.resp, b.inj, b.r = s, *c, resp, inj, r
	b.sc.Reset()
	b.outBuf, b.out, b.scratch = nil, nil, nil
	b.held, b.heldEnds, b.sawData = nil, nil, false
	b.head.Set(nil)
	b.fp.reset(inj&rewrite.IncludeUsage != 0 && (c.endpoint == openai.ChatCompletions || c.endpoint == openai.Completions) && r != nil && engines.InjectOf(r.Kind()).UsageFingerprint)
	b.off, b.first, b.eof, b.rerr, b.closed = 0, true, false, nil, false
	b.conn, b.deadline, b.done, b.errEvent, b.respEnd = conn, time.Time{}, false, false, false
	b.upstream = resp.BodyStream()
	b.es, _ = b.upstream.(*engineStream)
	if b.upstream == nil {
		b.bodyRdr.Reset(resp.Body())
		b.upstream = &b.bodyRdr
	}
	return b
}

// Read returns the next bytes for the client, reading the backend when
// nothing is pending. It returns io.EOF after the backend stream ended and
// everything (including a trailing error event) was returned. It serves a
// stream whose bytes go through a wrapper (Anthropic's /v1/messages) and
// fasthttp's writer; a stream written as it came is written by writeStream.
func (b *streamBody) Read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			n, err = 0, b.recovered(r)
		}
	}()
	for b.off >= len(b.out) {
		if b.eof {
			return 0, io.EOF
		}
		b.fill()
	}
	b.moveDeadline()
	n = copy(p, b.out[b.off:])
	b.off += n
	return n, nil
}

// recovered ends the stream after a panic while streaming.
func (b *streamBody) recovered(r any) error {
	b.s.log.Error("panic while streaming a response; stream ended", "panic", r)
	b.eof, b.rerr = true, fmt.Errorf("internal error: %v", r)
	return b.rerr
}

// moveDeadline gives the client ClientWriteTimeout to take the bytes about
// to be written, counted from now (the backend may have been silent long).
// Moving the deadline costs a timer update, so at most every 1/8 of it.
func (b *streamBody) moveDeadline() {
	if b.conn != nil {
		if now := time.Now(); now.Sub(b.deadline) > b.s.cfg.ClientWriteTimeout/8 {
			b.deadline = now
			b.s.writeDeadline(b.conn, now)
		}
	}
}

// writeStream writes the stream to the client connection (see
// hijackStream): head, the response headers, with the first burst; then
// each burst of events as one HTTP chunk in one write, straight from out;
// the last one with the last chunk ("0\r\n"). It returns once the stream
// ended, or with the error of a failed write.
func (b *streamBody) writeStream() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = b.recovered(r)
		}
		if err == errParked {
			return // b is the resuming goroutine's
		}
		if b.respHead != nil { // from streamHeadBufs, held until the first write
			*b.respHead = (*b.respHead)[:0]
			streamHeadBufs.Put(b.respHead)
			b.respHead = nil
		}
	}()
	for {
		for b.off >= len(b.out) && !b.eof {
			if b.park() {
				return errParked
			}
			b.fill()
		}
		b.moveDeadline()
		if head := b.respHead; head != nil {
			*head, err = b.writeChunk(*head)
			*head = (*head)[:0]
			streamHeadBufs.Put(head)
			b.respHead = nil
		} else {
			_, err = b.writeChunk(nil)
		}
		if err != nil || b.eof {
			return err
		}
	}
}

// parkAbove is how many streams must be under way on the gateway
// (Server.openStreams) before one that is not parked yet parks: fewer wait
// on their own goroutines, as they did before streams parked. Parking saves
// a stream's stack and the heap headroom it brings (16 KiB a stream), which
// matters with thousands open, and costs every wait two hand-offs (the
// parker's goroutine, then a worker) where the runtime's poller wakes the
// stream's goroutine itself: on an open loop of 300 streamed calls a second
// against a mock that answers at once (few streams open at a time), parked
// streams added about 100 µs to each call's latency (bench/RESULTS.md §20).
// A stream parked once stays on the workers (a worker must not block in a
// read). Tests set it to 0 to park every stream.
var parkAbove atomic.Int64

func init() { parkAbove.Store(64) }

// park parks the stream (parker) when its next fill would wait for the
// engine and many streams are open (parkAbove): it then waits without a
// goroutine, and resume writes on once the engine's next bytes are in (or
// its deadline passed). What fill does before it reads is done first: the
// payloads go to capture and the output buffer back to its pool. It reports
// whether the stream was parked; if so, b is the parker's (and then its
// worker's).
func (b *streamBody) park() bool {
	p := b.s.parker
	if p == nil || b.es == nil {
		return false
	}
	if b.resumed {
		b.resumed = false
		return false
	}
	if !b.onWorker && b.s.openStreams.Load() <= parkAbove.Load() {
		return false
	}
	ic, ok := b.es.parkable()
	if !ok {
		return false
	}
	ic.readable = false // only the wake-up that set it vouches for the socket
	b.handHeld()
	b.putOut()
	if b.ctx != nil {
		// fasthttp releases the hijacked request's context once this
		// goroutine returns (hijackConnHandler): nothing of it is used
		// after this. The attribution's views into the request go too.
		b.ctx = nil
		b.c.attr = attribution{}
	}
	return p.park(b, ic.raw, ic.parkDue())
}

// resume writes on a parked stream, on one of the parker's workers (its
// stack grown already), once the engine's next bytes are in or its
// deadline passed (the engine's read then fails as a read past the
// deadline fails). It reports whether the worker went on to serve the
// client's connection (runStream).
func (b *streamBody) resume() (retired bool) {
	b.resumed = true
	if ic, ok := b.es.wait.(*idleConn); ok {
		// Resumed by its deadline, or by its socket's event (the engine's
		// bytes, its end or an error: the read after it does not wait).
		ic.expired, ic.readable = b.parkExpiredNow, !b.parkExpiredNow
	}
	return b.s.runStream(b)
}

// parkExpired is the park timer's function: it resumes the stream if it is
// still parked and its deadline passed.
func (b *streamBody) parkExpired() {
	if p, _ := streamParker(); p != nil && p.expire(b) {
		p.dispatch(b)
	}
}

// chunkRoom is the room fill leaves before the client bytes in out, for the
// size line writeChunk puts in front of them.
const chunkRoom = 16

// A chunked body without trailers ends with the last chunk, then the empty
// trailer section: the client has the whole response only with the latter.
const (
	lastChunk    = "0\r\n"
	emptyTrailer = "\r\n"
)

// writeChunk writes the pending client bytes to the connection as one HTTP
// chunk (none when there are none) after head, in one write (head, grown,
// is returned); after the
// stream's last bytes it writes the last chunk with them (the body's very
// end, emptyTrailer, leaves once the call is captured: serveStream). A
// client that closed its side before that last write gets nothing
// (errClientHungUp): a socket whose peer has closed still accepts one
// write, and the call must not be counted as answered (hungUp).
func (b *streamBody) writeChunk(head []byte) ([]byte, error) {
	start := b.off
	if n := len(b.out) - b.off; n > 0 {
		var hex [16]byte
		size := strconv.AppendInt(hex[:0], int64(n), 16)
		start = b.off - len(size) - 2
		if start < 0 { // never: fill leaves chunkRoom, and off only grows
			return head, errors.New("stream chunk without room for its size line")
		}
		copy(b.out[start:], size)
		b.out[b.off-2], b.out[b.off-1] = '\r', '\n'
		b.out = append(b.out, '\r', '\n')
	}
	if b.eof {
		b.out = append(b.out, lastChunk...)
		if hungUp(b.conn) {
			return head, errClientHungUp
		}
	}
	p := b.out[start:]
	if head != nil {
		head = append(head, p...)
		p = head
	}
	b.off = len(b.out)
	if len(p) == 0 {
		return head, nil
	}
	if b.onWorker {
		b.s.parker.enterWrite()
		_, err := b.conn.Write(p)
		b.s.parker.leaveWrite()
		return head, err
	}
	_, err := b.conn.Write(p)
	return head, err
}

// hold keeps an event's data payload until the bytes of this fill have been
// handed to the client: capture assembles it then (handHeld), so forwarding
// never waits for capture's parsing.
func (b *streamBody) hold(data []byte) {
	b.held = append(b.held, data...)
	b.heldEnds = append(b.heldEnds, len(b.held))
	b.sawData = true
}

// handHeld gives the held payloads to capture, in order.
func (b *streamBody) handHeld() {
	start := 0
	for _, end := range b.heldEnds {
		b.c.pend.AddEvent(b.held[start:end])
		start = end
	}
	b.held, b.heldEnds = b.held[:0], b.heldEnds[:0]
}

// fill reads the backend once and turns what arrived into client bytes.
// It is called once the previous bytes were taken (written to the client,
// or returned by Read), so it first hands the previous payloads to capture.
func (b *streamBody) fill() {
	defer b.logIfEnded()
	b.handHeld()
	// Every byte of out was taken and the payloads are capture's: the stream
	// waits for the backend without an output buffer (and, when fasthttp
	// parses its chunks, without a read buffer: readBurst).
	b.putOut()
	// The head capture found in the chunks so far (id, object, created,
	// model, the same in every chunk): the stripper starts after it rather
	// than walking it again.
	if h := b.c.pend.Head(); !b.head.Matches(h) {
		b.head.Set(h)
	}
	n, err := b.readBurst()
	if b.es != nil && n == 0 {
		b.putIn()
	}
	b.takeOut()
	if n > 0 {
		b.sc.Feed(b.in[:n]) // the scanner copies: the read buffer is free again
		if b.es != nil {
			b.putIn()
		}
		for {
			ev, ok := b.sc.Next()
			if !ok {
				break
			}
			b.forwardEvent(ev)
		}
		if b.first {
			b.first = false
			b.noteFirstToken()
		}
	}
	if err != nil {
		b.endStream(err)
	}
	// The events were copied (out, held): between two reads, the stream
	// holds no scanner buffer either.
	b.sc.LetGo()
}

// readBurst reads the backend into b.in once, and on while its next chunk
// is already buffered: events that arrived together leave together (see
// engineStream.ready). The read buffer grows for a burst, up to
// maxBurstRead (not on the first read: the first token is not held back for
// the rest of a burst). When nothing is buffered, it waits on one byte and
// takes the read buffer once that byte is in, so that an open stream
// between two tokens holds none (fill gives it back once the scanner has
// the bytes); the engineStream waits without its own, when it can.
func (b *streamBody) readBurst() (n int, err error) {
	if b.es != nil && len(b.es.buffered()) == 0 {
		// Nothing of the backend's next bytes is here: wait for them
		// without a read buffer, on one byte, then read what came with it.
		n, err = b.upstream.Read(b.one[:])
		b.takeIn()
		b.in[0] = b.one[0]
		if err != nil || n == 0 || len(b.es.buffered()) == 0 {
			return n, err
		}
	} else {
		b.takeIn()
	}
	var m int
	m, err = b.upstream.Read(b.in[n:])
	n += m
	for err == nil && b.es != nil && b.es.ready() {
		if n == len(b.in) {
			if b.first || len(b.in) >= maxBurstRead {
				break
			}
			b.in = append(b.in, make([]byte, len(b.in))...)
			b.in = b.in[:cap(b.in)]
		}
		var m int
		m, err = b.upstream.Read(b.in[n:])
		n += m
	}
	if err == nil && b.es != nil && n < len(b.in) && b.es.endBuffered() {
		// The body's end came with these bytes: read it now (it returns
		// io.EOF without waiting), so that the stream's last bytes are known
		// to be last and leave with the end (see clientConn).
		var m int
		m, err = b.upstream.Read(b.in[n:])
		n += m
	}
	return n, err
}

// forwardEvent holds an event's payload for capture (noteEvent) and appends
// the client's copy of the event to out: as it came, without what the
// gateway injected, or not at all (a dropped usage chunk; finish chunks
// wait in fp for the usage chunk's system_fingerprint).
func (b *streamBody) forwardEvent(ev capture.Event) {
	if len(ev.Data) > 0 {
		b.noteEvent(ev.Data)
	}
	if b.inj == 0 || len(ev.Data) == 0 {
		if !b.fp.add(ev.Raw, ev.Data) { // held when finish chunks are
			b.out = append(b.out, ev.Raw...)
		}
		return
	}
	o, drop := rewrite.StripEventHead(b.scratch[:0], ev.Data, b.c.endpoint, b.inj, &b.head)
	if !sameStart(o, ev.Data) { // ev.Data is the scanner's buffer: never adopt it
		b.scratch = o
	}
	if b.fp.holding() && (drop && gjson.GetBytes(ev.Data, "usage").IsObject() || string(ev.Data) == "[DONE]" || bytes.HasPrefix(ev.Data, []byte(`{"error"`))) {
		// The dropped usage chunk (its fingerprint goes onto the held
		// finish chunks), or the stream's end without one.
		var usage []byte
		if drop {
			usage = ev.Data
		}
		b.out = b.fp.release(b.out, usage)
	}
	start := len(b.out)
	switch {
	case drop:
	case bytes.Equal(o, ev.Data):
		b.out = append(b.out, ev.Raw...)
	default:
		b.out = append(b.out, "data: "...)
		b.out = append(b.out, o...)
		b.out = append(b.out, "\n\n"...)
	}
	if !drop && b.fp.add(b.out[start:], o) {
		b.out = b.out[:start]
	}
}

// noteEvent holds an event's data payload for capture and notes whether it
// ends the stream ([DONE], an error event, a Responses stream's last event).
func (b *streamBody) noteEvent(data []byte) {
	b.hold(data)
	switch {
	case string(data) == "[DONE]":
		b.done = true
	case bytes.HasPrefix(data, []byte(`{"error"`)):
		b.errEvent = true
	case b.c.endpoint == openai.Responses && isResponseEnd(data):
		b.respEnd = true
	}
}

// noteFirstToken records the time to the first bytes of the answer, in the
// call's row and the TTFT histogram.
func (b *streamBody) noteFirstToken() {
	pend := b.c.pend
	ttft := time.Since(b.c.start)
	pend.Meta.TTFTNano = uint64(ttft)
	b.s.m.TTFT.WithLabelValues(metricModel(b.c.model, pend.Meta.Backend), pend.Meta.Endpoint).Observe(ttft.Seconds())
}

// endStream ends the client's stream after the backend's ended with err:
// held finish chunks go out as they are, a read error becomes an error
// event, an event left without its closing blank line is forwarded as is,
// and a chat or completions stream cut short says so.
func (b *streamBody) endStream(err error) {
	pend := b.c.pend
	b.eof = true
	if b.fp.holding() { // no usage chunk came: the finish chunks as they are
		b.out = b.fp.release(b.out, nil)
	}
	if err != io.EOF {
		b.rerr = err
		b.markReplica(false)
		status, typ := upstreamStatus(err)
		msg := fmt.Sprintf("backend %s failed mid-stream: %v", pend.Meta.Backend, err)
		pend.Meta.Error = msg
		b.out = append(b.out, "data: "...)
		b.out = appendError(b.out, status, typ, msg)
		b.out = append(b.out, "\n\n"...)
		return
	}
	// An event without its closing blank line at EOF is forwarded as is.
	if rest := b.sc.Rest(); len(rest) > 0 {
		b.out = append(b.out, rest...)
		if ev, ok := b.sc.Finish(); ok && len(ev.Data) > 0 {
			b.hold(ev.Data)
			b.done = b.done || string(ev.Data) == "[DONE]"
		}
	}
	// Chat and completion streams always end with [DONE]; one that just stops
	// was cut short by the backend (crash, proxy timeout): say so to the
	// client, as for a dropped connection, and in the captured row.
	cutShort := !b.done && !b.errEvent && b.sawData && (b.c.endpoint == openai.ChatCompletions || b.c.endpoint == openai.Completions)
	b.markReplica(!cutShort)
	if cutShort {
		msg := fmt.Sprintf("backend %s stream ended without [DONE] (cut short)", pend.Meta.Backend)
		pend.Meta.Error = msg
		b.out = append(b.out, "\n\ndata: "...)
		b.out = appendError(b.out, fasthttp.StatusBadGateway, errUpstream, msg)
		b.out = append(b.out, "\n\n"...)
	}
}

// markReplica gives the replica its verdict on the stream once it ended:
// one that stalls or drops a stream (its host cut off, its engine dead)
// fails like one that refuses a call, so --unhealthy-after of them in a
// row take it out of selection before the health checks do; its response
// headers alone do not count as a success (attemptUpstream).
func (b *streamBody) markReplica(ok bool) {
	switch {
	case b.r == nil:
	case ok:
		b.r.MarkSuccess()
	default:
		b.r.MarkFailure(b.s.cfg.UnhealthyAfter, b.s.cfg.UnhealthyCooldown)
	}
}

// logIfEnded logs the call to capture's write-ahead log (Pipeline.Commit)
// once the stream's end is in hand (data: [DONE], an error event, a
// Responses stream's response.completed / .incomplete / .failed, or the end
// of the backend's stream), before those last bytes are returned to the
// client, so a process kill cannot lose a call whose answer the client has.
// The last payloads are handed to capture first (they are in the record).
// Without a WAL it does nothing.
func (b *streamBody) logIfEnded() {
	if (b.done || b.errEvent || b.respEnd || b.eof) && b.s.capture.Logging() {
		b.handHeld()
		b.s.capture.Commit(b.c.pend)
	}
}

// isResponseEnd reports whether a Responses stream event is its last one
// (response.completed, .incomplete or .failed), with "type" first as
// OpenAI, vLLM and SGLang send it.
func isResponseEnd(data []byte) bool {
	const head = `{"type":"response.`
	if !bytes.HasPrefix(data, []byte(head)) {
		return false
	}
	rest := data[len(head):]
	return bytes.HasPrefix(rest, []byte(`completed"`)) || bytes.HasPrefix(rest, []byte(`incomplete"`)) || bytes.HasPrefix(rest, []byte(`failed"`))
}

// CloseWithError ends the call once fasthttp is done with the body: werr is
// the error writing to the client, if any.
func (b *streamBody) CloseWithError(werr error) error {
	if b.closed {
		return nil
	}
	b.closed = true
	if b.parkTimer != nil {
		if p, _ := streamParker(); p != nil { // the process's: the timer is its
			p.stopTimer(b)
		}
	}
	pend := b.c.pend
	switch {
	case b.rerr != nil:
		abortResponse(b.resp, b.rerr)
	case werr != nil || !b.eof || b.off < len(b.out):
		// The client went away: close the backend connection so the engine
		// aborts generation, and say so in the captured row.
		abortResponse(b.resp, errClientGone)
		pend.Meta.Error = "client disconnected mid-stream"
	default:
		fasthttp.ReleaseResponse(b.resp)
	}
	b.handHeld()
	b.s.release(b.r)
	b.s.releaseSlot()
	b.s.finish(&b.c, time.Now())
	b.s, b.resp, b.r, b.upstream, b.c, b.conn = nil, nil, nil, nil, call{}, nil
	b.es, b.ahead, b.ctx, b.resumed, b.onWorker = nil, nil, nil, false, false
	b.bodyRdr.Reset(nil)
	b.putOut()
	b.putIn()
	streamBodies.Put(b)
	return nil
}
