package mock

import (
	"bufio"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// vLLM 0.32's abort of token-in generations (served with the token-in
// routes, Config.ScaleOut): POST /inference/v1/abort_requests
// {"request_ids": [...]} (vllm/entrypoints/scale_out/token_in_token_out/
// api_router.py abort_requests: a missing request_ids is 400, otherwise
// 200 with no body and the abort runs in the background). The ids are the
// engine's external request ids: a generate request's is
// "generate-tokens-" + its X-Request-Id header, else its body's request_id,
// else a random uuid (token_in_token_out/serving.py serve_tokens,
// serve/engine/serving.py _base_request_id). An aborted stream ends as
// vLLM's does (v1/engine/output_processor.py abort_requests: a final
// output with no new ids and finish_reason "abort"): one chunk per
// unfinished choice with token_ids [] and finish_reason "abort", the usage
// chunk when asked for, then [DONE].
const PathAbortRequests = "/inference/v1/abort_requests"

// generateIDPrefix is vLLM's prefix of a generate request's external id.
const generateIDPrefix = "generate-tokens-"

// abortable is the set of streamed generate requests under way, by
// external id; abort closes a request's channel.
type abortable struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// register adds a streamed generate request under id and returns the
// channel abort closes and the function that removes it.
func (a *abortable) register(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = make(map[string]chan struct{})
	}
	if _, dup := a.m[id]; dup {
		return ch, func() {} // a second request under a live id: not abortable by it
	}
	a.m[id] = ch
	return ch, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.m[id] == ch {
			delete(a.m, id)
		}
	}
}

// abort closes the channels of the requests under ids and returns how many
// it found.
func (a *abortable) abort(ids []string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, id := range ids {
		if ch, ok := a.m[id]; ok {
			close(ch)
			delete(a.m, id)
			n++
		}
	}
	return n
}

// abortAll closes every registered request's channel.
func (a *abortable) abortAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, ch := range a.m {
		close(ch)
		delete(a.m, id)
	}
}

// abortRequests serves PathAbortRequests.
func (s *Server) abortRequests(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	if jsonscan.Validate(body) != nil || !gjson.ParseBytes(body).IsObject() {
		s.writeError(ctx, fasthttp.StatusBadRequest, "JSON decode error: the request body is not a JSON object")
		return
	}
	ids := gjson.GetBytes(body, "request_ids")
	if !ids.IsArray() {
		s.writeError(ctx, fasthttp.StatusBadRequest, "Missing 'request_ids' in request body")
		return
	}
	var list []string
	for _, id := range ids.Array() {
		list = append(list, id.String())
	}
	s.aborts.abort(list)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// generateID is the external id vLLM gives a generate request.
func generateID(ctx *fasthttp.RequestCtx, body []byte, planID []byte) string {
	if h := ctx.Request.Header.Peek("X-Request-Id"); h != nil {
		return generateIDPrefix + string(h)
	}
	if id := gjson.GetBytes(body, "request_id"); id.Type == gjson.String {
		return generateIDPrefix + id.Str
	}
	return generateIDPrefix + string(planID)
}

// errAborted ends the wait of an aborted non-streamed generate request.
var errAborted = errors.New("mock vLLM: request aborted")

// waitOrAbort is waitOrLeave that also ends, with errAborted, when abort
// is closed.
func (s *Server) waitOrAbort(t **time.Timer, d time.Duration, left, abort <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	select {
	case <-(*t).C:
		return nil
	case <-s.done:
		(*t).Stop()
		return errShutdown
	case <-left:
		(*t).Stop()
		return errClientLeft
	case <-abort:
		(*t).Stop()
		return errAborted
	}
}

// cutAborted leaves each choice of a non-streamed generate request aborted
// after elapsed with the ids sampled by then (the first after TTFT, one
// more per ITL) and finish_reason "abort", as vLLM's final output of an
// aborted request carries every id so far (v1/engine/output_processor.py,
// RequestOutputKind.FINAL_ONLY).
func (p *plan) cutAborted(elapsed time.Duration) {
	n := 0
	if elapsed >= p.k.ttft {
		n = 1
		if p.k.itl > 0 {
			n += int((elapsed - p.k.ttft) / p.k.itl)
		}
	}
	for i := range p.choices {
		c := &p.choices[i]
		if n < len(c.ids) {
			c.ids = c.ids[:n]
		}
		c.finish, c.stopStr = "abort", ""
	}
}

// aborted reports whether the plan's generate request was aborted.
func (p *plan) aborted() bool {
	if p.abort == nil {
		return false
	}
	select {
	case <-p.abort:
		return true
	default:
		return false
	}
}

// streamAborted ends an aborted generate stream: an abort chunk for each
// choice not finished by step st, the usage chunk (the ids sent so far)
// when asked for, then [DONE].
func (p *plan) streamAborted(w *bufio.Writer, st int) {
	sent := 0
	for i := range p.choices {
		c := &p.choices[i]
		n := c.steps()
		sent += min(st, n)
		if st >= n {
			continue
		}
		p.buf = append(p.buf[:0], `{"request_id":"chatcmpl-`...)
		p.buf = append(p.buf, p.id[:]...)
		p.buf = strconv.AppendInt(append(p.buf, `","usage":null,"output_mode":"tokens","choices":[{"index":`...), int64(i), 10)
		p.buf = append(p.buf, `,"finish_reason":"abort","stop_reason":null,"token_ids":[],"routed_experts":null,"sampling_mask":null,"weight_versions":null,"logprobs":null}]}`...)
		if sse(w, p.buf) != nil {
			return
		}
	}
	if p.includeUsage {
		p.buf = append(p.buf[:0], `{"request_id":"chatcmpl-`...)
		p.buf = append(p.buf, p.id[:]...)
		p.buf = appendUsage(append(p.buf, `","usage":`...), p.promptTokens(), sent)
		p.buf = append(p.buf, `,"output_mode":"tokens","choices":[]}`...)
		if sse(w, p.buf) != nil {
			return
		}
	}
	_ = sse(w, doneEvent)
}
