package gateway

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export/arrays"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/openai"
)

// Generations that survive a weight update (POST /api/v1/pause?mode=abort).
//
// A pause in mode wait (the default) holds new calls and lets the ones in
// flight finish, so a weight update waits for the longest generation. In
// mode abort the gateway also aborts, at the engine, every streamed token-in
// generation with one choice (tokenInPump with a resumeState) and keeps its
// client's stream open; on resume it sends the prompt ids + the ids the
// client already received to the replica the routing table then names (PUT
// /api/v1/backends may have replaced it, with a new policy_version), with
// max_tokens reduced by what was generated, and goes on writing the same
// client stream: the derender stream_state carries over, so the text goes on
// where it stopped, each id derendered once. The row keeps one response: its
// ids and logprobs are the concatenation of the segments' (each segment's
// logprobs are its own generation's), and policy_versions gives the segments
// as [[first response token index, policy version], ...].
//
// The abort, vLLM 0.32.0: POST /inference/v1/abort_requests {"request_ids":
// ["generate-tokens-<request_id>"]} (scale_out/token_in_token_out/
// api_router.py, registered with the token-in routes; the external id is
// "generate-tokens-" + the GenerateRequest's request_id, serving.py
// serve_tokens, since the gateway never forwards X-Request-Id). The engine
// ends the stream with a final output of no new ids and finish_reason
// "abort" (v1/engine/output_processor.py abort_requests), then the usage
// chunk and [DONE]; the gateway takes those for itself and the client sees
// none of them. Closing the connection would abort too (the route is
// @with_cancellation), but the ids the engine sampled after the last chunk
// read would then be lost mid-frame; with the abort request every id the
// engine sent arrives and reaches the client.
//
// Not resumed, in mode abort as in mode wait (they finish on the old
// weights): passthrough calls (the gateway holds no ids to continue from),
// non-streamed token-in calls and streams with n > 1. An abort request the
// engine refuses or does not answer leaves that generation to finish.

// Pause modes (POST /api/v1/pause?mode=...).
const (
	PauseWait  = "wait"  // in-flight calls finish (the default)
	PauseAbort = "abort" // streamed token-in generations are aborted and resumed after the update
)

// pathAbortRequests is vLLM 0.32's abort route for token-in generations.
const pathAbortRequests = "/inference/v1/abort_requests"

// engineIDPrefix is vLLM's prefix of a generate request's external id.
const engineIDPrefix = "generate-tokens-"

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

// resumables is the set of streams a pause in mode abort aborts.
type resumables struct {
	mu     sync.Mutex
	set    map[*tokenInPump]struct{}
	parked atomic.Int64 // aborted streams waiting for resume
}

// add registers p; when the gateway is already paused in mode abort (the
// call passed the pause check just before it), p is aborted at once.
func (rs *resumables) add(s *Server, p *tokenInPump) {
	rs.mu.Lock()
	if rs.set == nil {
		rs.set = make(map[*tokenInPump]struct{})
	}
	rs.set[p] = struct{}{}
	rs.mu.Unlock()
	if paused, abort := s.pause.abortMode(); paused && abort {
		p.rs.requestAbort(s)
	}
}

func (rs *resumables) remove(p *tokenInPump) {
	rs.mu.Lock()
	delete(rs.set, p)
	rs.mu.Unlock()
}

// abortAll asks the engines to abort every registered generation and waits
// for their answers; it returns how many aborts were requested.
func (rs *resumables) abortAll(s *Server) int {
	rs.mu.Lock()
	list := make([]*tokenInPump, 0, len(rs.set))
	for p := range rs.set {
		list = append(list, p)
	}
	rs.mu.Unlock()
	var wg sync.WaitGroup
	var n atomic.Int64
	for _, p := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p.rs.requestAbort(s) {
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
	engineID string             // the current generate request's external id
	aborting bool               // an abort of the current request was asked for
	parked   bool               // the current request ended by that abort

	orig    *backends.Upstream // the replica the client stream releases when it ends
	base    string             // request id base; segment k is base-k
	seg     int
	genBody []byte // the streamed GenerateRequest as first sent (its own copy)
	model   string // the routed model and the rollout, to route the resumed request
	rollout string
	pend    *capture.Pending
	segs    []policySegment
	carried int // response ids generated before the current segment
}

// newResumeState prepares the stream of call c, started on r with genBody,
// for abort and resume.
func newResumeState(c *call, r *backends.Upstream, genBody []byte) *resumeState {
	base := "rollgate-" + string(c.pend.IDs.Span[:])
	return &resumeState{
		r: r, orig: r, engineID: engineIDPrefix + base + "-0", base: base,
		genBody: genBody, model: c.model, rollout: string(c.attr.rolloutID), pend: c.pend,
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
	r, id := rs.r, rs.engineID
	rs.mu.Unlock()
	body := append(append([]byte(`{"request_ids":[`), appendJSONString(nil, id)...), "]}"...)
	out, status, err := s.tokenInPostTimeout(r, r.Origin()+pathAbortRequests, body, time.Now().Add(abortTimeout))
	if err == nil && status != fasthttp.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", status, truncate(string(out), 200))
	}
	if err != nil {
		s.log.Warn("pause: the engine did not abort a generation; it finishes on the current weights", "backend", r.Name(), "request_id", id, "err", err)
		return false
	}
	return true
}

// tokenInPostTimeout is tokenInPost without a client request.
func (s *Server) tokenInPostTimeout(r *backends.Upstream, url string, body []byte, deadline time.Time) ([]byte, int, error) {
	return s.tokenInPost(r, url, body, deadline, nil, nil)
}

// parkOn reports whether a generate chunk is the end of a generation the
// gateway aborted (finish_reason "abort" after requestAbort); then the
// stream parks: the chunk's ids (if any) go on without a finish reason, and
// the usage chunk and [DONE] that follow are not for the client.
func (rs *resumeState) parkOn(ch gjson.Result) bool {
	if rs == nil || ch.Get("finish_reason").Str != "abort" {
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

// resume waits for the gateway to resume and sends the rest of the
// generation to the replica now serving the model: the prompt ids + the
// ids generated so far, max_tokens reduced by their number. It returns the
// new generate stream, or nil when nothing is left to generate (the stream
// was finished here), or an error that ends the client's stream.
func (p *tokenInPump) resume() (*fasthttp.Response, error) {
	rs, c := p.rs, &p.ch[0]
	for {
		if paused, _, resumed := p.s.pause.state(); paused {
			t := time.NewTimer(p.s.cfg.PauseMaxHold)
			select {
			case <-resumed:
				t.Stop()
			case <-t.C:
				return nil, fmt.Errorf("the gateway stayed paused longer than pause_max_hold (%s) after aborting the generation", p.s.cfg.PauseMaxHold)
			}
		}
		if paused, _ := p.s.pause.abortMode(); !paused {
			break
		}
	}
	rs.mu.Lock()
	rs.parked, rs.aborting = false, false
	rs.mu.Unlock()
	p.s.resumables.parked.Add(-1)

	t := p.s.backends.Load()
	pl := t.Pool([]byte(rs.model))
	if pl == nil {
		pl = t.Wildcard()
	}
	if pl == nil {
		return nil, fmt.Errorf("no backend serves model %q after the resume", rs.model)
	}
	r := p.s.pick(pl, []byte(rs.rollout), nil)
	switch {
	case r == nil:
		return nil, fmt.Errorf("no healthy replica of model %q after the resume", rs.model)
	case r.Kind() != openai.KindVLLM:
		return nil, fmt.Errorf("replica %s of model %q is of kind %s after the resume: it has no token-in generate", r.Name(), rs.model, r.Kind())
	}
	body, left, err := resumedBody(rs.genBody, p.tc.prompt, c.ids)
	if err != nil {
		return nil, err
	}
	if left == 0 { // max_tokens were all generated: the answer ends here
		return nil, p.finishLength()
	}
	rs.seg++
	id := rs.base + "-" + strconv.Itoa(rs.seg)
	if body, err = sjson.SetBytes(body, "request_id", id); err != nil {
		return nil, fmt.Errorf("%w: %w", errTokenIn, err)
	}
	p.s.acquire(r)
	rs.mu.Lock()
	rs.r, rs.engineID = r, engineIDPrefix+id
	rs.mu.Unlock()
	p.r = r
	p.s.log.Info("token-in: resuming a generation", "backend", r.Name(), "policy_version", r.Spec().PolicyVersion, "at_token", len(c.ids))
	gen, err := p.s.startGenerate(r, body, nil, time.Now().Add(p.s.cfg.UpstreamTimeout))
	if err != nil {
		return nil, err
	}
	if status := gen.StatusCode(); status != fasthttp.StatusOK {
		out, _ := readAll(gen, p.s.cfg.MaxResponseBodyBytes)
		abortResponse(gen, errTokenIn)
		return nil, fmt.Errorf("the engine answered HTTP %d: %s", status, truncate(string(out), 300))
	}
	// The segment starts here: its ids and logprobs are this generation's.
	rs.carried = len(c.ids)
	rs.segs = append(rs.segs, policySegment{len(c.ids), r.Spec().PolicyVersion})
	rs.pend.Meta.PolicyVersions = rs.segmentsJSON()
	return gen, nil
}

// resumedBody is the GenerateRequest that continues genBody after ids:
// token_ids = prompt + ids, sampling_params.max_tokens (when set) reduced by
// len(ids). left is what max_tokens leaves (-1: not set).
func resumedBody(genBody []byte, prompt, ids []uint32) (body []byte, left int, err error) {
	all := arrays.AppendUint32s(make([]byte, 0, 8*(len(prompt)+len(ids))), append(append(make([]uint32, 0, len(prompt)+len(ids)), prompt...), ids...))
	if body, err = sjson.SetRawBytes(genBody, "token_ids", all); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errTokenIn, err)
	}
	left = -1
	if mt := gjson.GetBytes(genBody, "sampling_params.max_tokens"); mt.Type == gjson.Number {
		left = max(int(mt.Int())-len(ids), 0)
		if left > 0 {
			if body, err = sjson.SetBytes(body, "sampling_params.max_tokens", left); err != nil {
				return nil, 0, fmt.Errorf("%w: %w", errTokenIn, err)
			}
		}
	}
	return body, left, nil
}

// finishLength ends a stream whose max_tokens were all generated before the
// abort took effect, as the engine would have: a finish chunk with reason
// "length", then [DONE].
func (p *tokenInPump) finishLength() error {
	chunk := []byte(`{"request_id":"","choices":[{"index":0,"token_ids":[],"finish_reason":"length","stop_reason":null,"logprobs":null}]}`)
	for _, ev := range [][]byte{chunk, []byte("[DONE]")} {
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
