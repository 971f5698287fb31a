package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/gateway/backends"
)

// Generations that survive a weight update (POST /api/v1/pause?mode=abort).
//
// A pause in mode wait (the default) holds new calls and lets the ones in
// flight finish, so a weight update waits for the longest generation. In
// mode abort the gateway also aborts, at the engine, every token-in
// generation with one choice (a resumeState: a stream's tokenInPump, or a
// non-streamed call's tokenInGenerate) and keeps its client waiting; on
// resume it sends the prompt ids + the ids generated so far to the replica
// the routing table then names (PUT /api/v1/backends may have replaced it,
// with a new policy_version), with max_tokens reduced by what was
// generated, and goes on writing the same client stream (a non-streamed
// call gets one answer joining the segments): the derender stream_state carries over, so the text goes on
// where it stopped, each id derendered once. The row keeps one response: its
// ids and logprobs are the concatenation of the segments' (each segment's
// logprobs are its own generation's), and policy_versions gives the segments
// as [[first response token index, policy version], ...].
//
// The abort is the engine kind's (engines.TokenIn: TokenInPaths().Abort
// with AbortBody(EngineRequestID(request id))); vLLM 0.32.0: POST
// /inference/v1/abort_requests {"request_ids":
// ["generate-tokens-<request_id>"]} (engines/vllm). The engine
// ends the stream with a final output of no new ids and finish_reason
// "abort" (v1/engine/output_processor.py abort_requests), then the usage
// chunk and [DONE]; the gateway takes those for itself and the client sees
// none of them. Closing the connection would abort too (the route is
// @with_cancellation), but the ids the engine sampled after the last chunk
// read would then be lost mid-frame; with the abort request every id the
// engine sent arrives and reaches the client.
//
// Not resumed, in mode abort as in mode wait (they finish on the old
// weights): passthrough calls (the gateway holds no ids to continue from:
// aborting them could only fail them) and token-in calls with n > 1 (each
// choice would need its own continuation). An abort request the
// engine refuses or does not answer leaves that generation to finish.

// Pause modes (POST /api/v1/pause?mode=...).
const (
	PauseWait  = "wait"  // in-flight calls finish (the default)
	PauseAbort = "abort" // streamed token-in generations are aborted and resumed after the update
)

// abortTimeout bounds one abort request to an engine.
const abortTimeout = 5 * time.Second

// PauseWith pauses the gateway in mode (PauseWait or PauseAbort; "" is
// PauseWait). In mode abort it also aborts the resumable generations in
// flight and returns once every engine answered its abort request (or
// abortTimeout passed). A pause in mode wait while paused in mode abort
// leaves mode abort.
func (s *Server) PauseWith(mode string) error {
	switch mode {
	case "", PauseWait:
		s.Pause()
		return nil
	case PauseAbort:
		s.pause.pause()
		s.pause.setAbort()
		n := s.resumables.abortAll(s)
		s.log.Info("paused: holding new calls, aborting resumable generations", "aborted", n, "in_flight", s.PauseState().InFlight)
		return nil
	}
	return fmt.Errorf("mode: unknown pause mode %q: use %q (in-flight calls finish; the default) or %q (streamed token-in generations are aborted and resumed on the new weights)", truncate(mode, 64), PauseWait, PauseAbort)
}

// resumables is the set of generations a pause in mode abort aborts.
type resumables struct {
	mu     sync.Mutex
	set    map[*resumeState]struct{}
	parked atomic.Int64 // aborted generations waiting for resume
}

// add registers g; when the gateway is already paused in mode abort (the
// call passed the pause check just before it), g is aborted at once.
func (rs *resumables) add(s *Server, g *resumeState) {
	rs.mu.Lock()
	if rs.set == nil {
		rs.set = make(map[*resumeState]struct{})
	}
	rs.set[g] = struct{}{}
	rs.mu.Unlock()
	if paused, abort := s.pause.abortMode(); paused && abort {
		g.requestAbort(s)
	}
}

func (rs *resumables) remove(g *resumeState) {
	rs.mu.Lock()
	delete(rs.set, g)
	rs.mu.Unlock()
}

// abortAll asks the engines to abort every registered generation and waits
// for their answers; it returns how many aborts were requested.
func (rs *resumables) abortAll(s *Server) int {
	rs.mu.Lock()
	list := make([]*resumeState, 0, len(rs.set))
	for g := range rs.set {
		list = append(list, g)
	}
	rs.mu.Unlock()
	var wg sync.WaitGroup
	var n atomic.Int64
	for _, g := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g.requestAbort(s) {
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(n.Load())
}

// policySegment is where a policy version starts in a response.
type policySegment struct {
	start   int
	version string
}

// resumeState is a resumable stream's state beyond the pump's own.
type resumeState struct {
	mu       sync.Mutex
	r        *backends.Upstream // the replica generating now; nil while parked
	id       string             // the current generate request's request id
	aborting bool               // an abort of the current request was asked for
	parked   bool               // the current request ended by that abort

	orig    *backends.Upstream // the replica the client stream releases when it ends
	base    string             // request id base; segment k is base-k
	seg     int
	genBody []byte // the generate request as first sent
	model   string // the routed model and the rollout, to route the resumed request
	rollout string
	pend    *capture.Pending
	segs    []policySegment
	carried int // response ids generated before the current segment
	// trace holds the W3C trace context headers (traceparent, tracestate)
	// of a stream's first generate request: its resumed requests carry
	// them too, the client's request being gone by then.
	trace [][2]string
}

// keepTrace keeps from's trace context headers for the resumed requests.
func (rs *resumeState) keepTrace(from *fasthttp.Request) {
	if from == nil {
		return
	}
	for _, h := range [...]string{"traceparent", "tracestate"} {
		if v := from.Header.Peek(h); len(v) > 0 {
			rs.trace = append(rs.trace, [2]string{h, string(v)})
		}
	}
}

// newResumeState prepares the generation of call c, started on r, for
// abort and resume; its generate request is to carry the request id id
// (and genBody is to be set to it).
func newResumeState(c *call, r *backends.Upstream) *resumeState {
	base := "rollgate-" + string(c.pend.IDs.Span[:])
	return &resumeState{
		r: r, orig: r, id: base + "-0", base: base,
		model: c.model, rollout: string(c.attr.rolloutID), pend: c.pend,
		segs: []policySegment{{0, r.Spec().PolicyVersion}},
	}
}

// requestAbort asks the engine to abort the current generation; false when
// there is none (parked) or it was asked already.
func (rs *resumeState) requestAbort(s *Server) bool {
	rs.mu.Lock()
	if rs.aborting || rs.r == nil {
		rs.mu.Unlock()
		return false
	}
	rs.aborting = true
	r := rs.r
	rs.mu.Unlock()
	ti := tokenInOf(r)
	if ti == nil { // cannot happen: the generation went to a token-in kind
		return false
	}
	id := ti.EngineRequestID(rs.id)
	out, status, err := s.tokenInPostTimeout(r, r.Origin()+ti.TokenInPaths().Abort, ti.AbortBody(id), time.Now().Add(abortTimeout))
	if err == nil && status != fasthttp.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", status, truncate(string(out), 200))
	}
	if err != nil {
		s.log.Warn("pause: the engine did not abort a generation; it finishes on the current weights", "backend", r.Name(), "request_id", id, "err", err)
		return false
	}
	s.m.TokenInResumes.WithLabelValues("aborted").Inc()
	return true
}

// tokenInPostTimeout is tokenInPost without a client request.
func (s *Server) tokenInPostTimeout(r *backends.Upstream, url string, body []byte, deadline time.Time) ([]byte, int, error) {
	return s.tokenInPost(r, url, body, deadline, nil, nil)
}

// parkOn reports whether a generate choice that finished with reason finish
// is the end of a generation the gateway aborted ("abort" after
// requestAbort); then the
// stream parks: the chunk's ids (if any) go on without a finish reason, and
// the usage chunk and [DONE] that follow are not for the client.
func (rs *resumeState) parkOn(finish string) bool {
	if rs == nil || finish != "abort" {
		return false
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rs.aborting {
		return false
	}
	rs.parked = true
	return true
}

// isParked says whether the current generation ended by the gateway's abort.
func (rs *resumeState) isParked() bool {
	if rs == nil {
		return false
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.parked
}

// fixUsage turns a resumed generation's usage (its prompt includes the ids
// carried over) into the client's: those ids are completion tokens.
func (rs *resumeState) fixUsage(u gjson.Result) []byte {
	if rs == nil || rs.carried == 0 {
		return []byte(u.Raw)
	}
	out := []byte(u.Raw)
	if pt := u.Get("prompt_tokens"); pt.Type == gjson.Number {
		out, _ = sjson.SetBytes(out, "prompt_tokens", max(pt.Int()-int64(rs.carried), 0))
	}
	if ct := u.Get("completion_tokens"); ct.Type == gjson.Number {
		out, _ = sjson.SetBytes(out, "completion_tokens", ct.Int()+int64(rs.carried))
	}
	return out
}

// park gives up the replica while the stream waits for resume.
func (rs *resumeState) park(s *Server) {
	rs.mu.Lock()
	r := rs.r
	rs.r = nil
	rs.mu.Unlock()
	if r != nil {
		s.release(r)
	}
	s.resumables.parked.Add(1)
}

// settle leaves the replica counts as the client stream's end expects: the
// replica it started on counted once (streamBody releases it). Idempotent.
func (rs *resumeState) settle(s *Server) {
	if rs == nil {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.parked {
		s.resumables.parked.Add(-1)
		rs.parked = false
	}
	if rs.r == rs.orig {
		return
	}
	if rs.r != nil {
		s.release(rs.r)
	}
	s.acquire(rs.orig)
	rs.r = rs.orig
}

// segmentsJSON is the policy_versions column: [[start, "version"], ...].
func (rs *resumeState) segmentsJSON() string {
	out := []byte{'['}
	for i, sg := range rs.segs {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendInt(append(out, '['), int64(sg.start), 10)
		out = append(appendJSONString(append(out, ','), sg.version), ']')
	}
	return string(append(out, ']'))
}

// next waits for the gateway to resume and prepares the rest of a parked
// generation after ids (the response ids so far): the replica the routing
// table now names for the model and the generate request (the prompt ids +
// ids, max_tokens reduced by their number: the engine's ResumeBody), which it marks as the current
// one (abortable again). left 0: max_tokens were all generated, nothing
// is sent.
func (rs *resumeState) next(s *Server, prompt, ids []uint32) (r *backends.Upstream, ti engines.TokenIn, body []byte, left int, err error) {
	for {
		if paused, _, resumed := s.pause.state(); paused {
			t := time.NewTimer(s.cfg.PauseMaxHold)
			select {
			case <-resumed:
				t.Stop()
			case <-t.C:
				s.resumables.parked.Add(-1)
				rs.mu.Lock()
				rs.parked = false
				rs.mu.Unlock()
				return nil, nil, nil, 0, fmt.Errorf("the gateway stayed paused longer than pause_max_hold (%s) after aborting the generation", s.cfg.PauseMaxHold)
			}
		}
		if paused, _ := s.pause.abortMode(); !paused {
			break
		}
	}
	rs.mu.Lock()
	rs.parked, rs.aborting = false, false
	rs.mu.Unlock()
	s.resumables.parked.Add(-1)

	t := s.backends.Load()
	pl := t.Pool([]byte(rs.model))
	if pl == nil {
		pl = t.Wildcard()
	}
	if pl == nil {
		return nil, nil, nil, 0, fmt.Errorf("no backend serves model %q after the resume", rs.model)
	}
	r = s.pick(pl, []byte(rs.rollout), nil)
	if r == nil {
		return nil, nil, nil, 0, fmt.Errorf("no healthy replica of model %q after the resume", rs.model)
	}
	if ti = tokenInOf(r); ti == nil {
		return nil, nil, nil, 0, fmt.Errorf("replica %s of model %q is of kind %s after the resume: it has no token-in generate", r.Name(), rs.model, r.Kind())
	}
	id := rs.base + "-" + strconv.Itoa(rs.seg+1)
	if body, left, err = ti.ResumeBody(rs.genBody, prompt, ids, id); err != nil || left == 0 {
		return nil, nil, nil, left, err
	}
	rs.seg++
	s.acquire(r)
	rs.mu.Lock()
	rs.r, rs.id = r, id
	rs.mu.Unlock()
	s.log.Info("token-in: resuming a generation", "backend", r.Name(), "policy_version", r.Spec().PolicyVersion, "at_token", len(ids))
	return r, ti, body, left, nil
}

// segment records that the generation on r, started after n response ids,
// was accepted by the engine: its ids and logprobs are that generation's.
func (rs *resumeState) segment(s *Server, r *backends.Upstream, n int) {
	s.m.TokenInResumes.WithLabelValues("resumed").Inc()
	rs.carried = n
	rs.segs = append(rs.segs, policySegment{n, r.Spec().PolicyVersion})
	rs.pend.Meta.PolicyVersions = rs.segmentsJSON()
}

// resume waits for the gateway to resume and sends the rest of the
// generation to the replica now serving the model (resumeState.next). It
// returns the new generate stream, or nil when nothing is left to generate
// (the stream was finished here), or an error that ends the client's
// stream.
func (p *tokenInPump) resume() (*fasthttp.Response, error) {
	rs, c := p.rs, &p.ch[0]
	failed := p.s.m.TokenInResumes.WithLabelValues("failed")
	r, ti, body, left, err := rs.next(p.s, p.tc.prompt, c.ids)
	if err != nil {
		failed.Inc()
		return nil, err
	}
	if left == 0 { // max_tokens were all generated: the answer ends here
		p.s.m.TokenInResumes.WithLabelValues("finished").Inc()
		return nil, p.finishLength()
	}
	p.r, p.ti = r, ti
	var from *fasthttp.Request // the kept trace context, as the first request had it
	if len(rs.trace) > 0 {
		from = fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(from)
		for _, h := range rs.trace {
			from.Header.Set(h[0], h[1])
		}
	}
	gen, err := p.s.startGenerate(r, ti, body, from, time.Now().Add(p.s.cfg.UpstreamTimeout))
	if err != nil {
		failed.Inc()
		return nil, err
	}
	if status := gen.StatusCode(); status != fasthttp.StatusOK {
		out, _ := readAll(gen, p.s.cfg.MaxResponseBodyBytes)
		abortResponse(gen, errTokenIn)
		failed.Inc()
		return nil, fmt.Errorf("the engine answered HTTP %d: %s", status, truncate(string(out), 300))
	}
	rs.segment(p.s, r, len(c.ids))
	return gen, nil
}

// tokenInGenerate sends a non-streamed generate request genBody to r and
// returns the engine's answer. With rs (one choice: resumable; genBody
// carries its request id) a pause in mode abort aborts it (the engine
// answers the ids so far with finish reason "abort"); it then waits for
// the resume and asks the replica then routed for the rest, as a stream's
// pump does, and returns one answer: every segment's ids and logprobs,
// the usage of the whole. A resume the engine cannot continue is a 502
// error body naming the response token it stopped at. parsed is the
// answer as the engine's ParseGenerate read it, when it did (nil: not read).
func (s *Server) tokenInGenerate(r *backends.Upstream, ti engines.TokenIn, genBody []byte, prompt []uint32, rs *resumeState, deadline time.Time, hw *hangupWatch, from *fasthttp.Request) (answer []byte, parsed *engines.Generated, status int, err error) {
	if rs == nil {
		answer, status, err = s.tokenInPost(r, r.Origin()+ti.TokenInPaths().Generate, genBody, deadline, hw, from)
		return answer, nil, status, err
	}
	rs.genBody = genBody
	s.resumables.add(s, rs)
	defer s.resumables.remove(rs)
	defer rs.settle(s)
	var ids []uint32
	var lps []byte // the aborted segments' logprobs entries, comma-separated
	cur, body := r, genBody
	for {
		gen, status, err := s.tokenInPost(cur, cur.Origin()+ti.TokenInPaths().Generate, body, deadline, hw, from)
		if len(ids) > 0 && (err != nil && !errors.Is(err, errClientGone) || err == nil && status != fasthttp.StatusOK) {
			if err == nil {
				err = fmt.Errorf("the engine answered HTTP %d: %s", status, truncate(string(gen), 300))
			}
			return s.resumeFailed(len(ids), err), nil, fasthttp.StatusBadGateway, nil
		}
		if err != nil || status != fasthttp.StatusOK {
			return gen, nil, status, err
		}
		if len(ids) > 0 {
			rs.segment(s, cur, len(ids))
		}
		g, perr := ti.ParseGenerate(gen)
		if perr != nil || len(g.Choices) == 0 || !rs.parkOn(g.Choices[0].Finish) {
			if len(ids) == 0 && perr == nil {
				return gen, &g, status, nil // read once: the caller uses it
			}
			out, err := joinGenerate(ti, gen, g.Usage, ids, lps, rs, "")
			return out, nil, status, err
		}
		ch := g.Choices[0]
		prevIDs, prevLps := len(ids), len(lps)
		ids = append(ids, ch.IDs...)
		for _, e := range ch.Logprobs.Array() {
			if len(lps) > 0 {
				lps = append(lps, ',')
			}
			lps = append(lps, e.Raw...)
		}
		rs.park(s)
		var left int
		prevTI := ti // gen's engine
		cur, ti, body, left, err = rs.next(s, prompt, ids)
		if err != nil {
			return s.resumeFailed(len(ids), err), nil, fasthttp.StatusBadGateway, nil
		}
		if left == 0 { // max_tokens all generated: the aborted answer, finished by length
			s.m.TokenInResumes.WithLabelValues("finished").Inc()
			out, err := joinGenerate(prevTI, gen, g.Usage, ids[:prevIDs], lps[:prevLps], rs, "length")
			return out, nil, status, err
		}
		deadline = time.Now().Add(s.cfg.UpstreamTimeout)
	}
}

// resumeFailed is the error body of a non-streamed generation whose resume
// failed after n response ids; it counts the failure.
func (s *Server) resumeFailed(n int, err error) []byte {
	s.m.TokenInResumes.WithLabelValues("failed").Inc()
	return appendError(nil, fasthttp.StatusBadGateway, errUpstream, fmt.Sprintf("token-in: resuming at response token %d: %v", n, err))
}

// joinGenerate is a non-streamed generate answer gen (whose usage is
// usage) preceded by the ids and logprobs entries of the aborted segments
// (the engine's JoinGenerate): the usage counts the carried ids as
// completion tokens (rs.fixUsage); finish, when set, replaces the finish
// reason.
func joinGenerate(ti engines.TokenIn, gen []byte, usage gjson.Result, ids []uint32, lps []byte, rs *resumeState, finish string) ([]byte, error) {
	if len(ids) == 0 && finish == "" {
		return gen, nil
	}
	var u []byte
	if usage.IsObject() {
		u = rs.fixUsage(usage)
	}
	return ti.JoinGenerate(gen, ids, lps, u, finish)
}

// finishLength ends a stream whose max_tokens were all generated before the
// abort took effect, as the engine would have: a finish chunk with reason
// "length", then [DONE].
func (p *tokenInPump) finishLength() error {
	for _, ev := range [][]byte{p.ti.LengthChunk(), []byte("[DONE]")} {
		_, werr, failure := p.event(ev)
		if failure != nil {
			return failure
		}
		if werr != nil {
			return werr
		}
	}
	p.rs.settle(p.s)
	_ = p.w.Close()
	return nil
}
