package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/internal/openai"
)

// call is the state of one proxied request.
type call struct {
	start    time.Time
	endpoint openai.Endpoint
	pend     *capture.Pending
	attr     attribution // validated; views into the request
	model    string
	tr       callTrace   // the gateway's own spans, when the call is traced
	opts     callOptions // set by a mounted route (ProxyAgent)
	seq      pendingSeq  // the reservation of its sequence id under way (admitAhead)
}

// pendingSeq is a call's sequence id while its block is being reserved:
// the reservation's ticket (nil: none under way).
type pendingSeq struct {
	t *seqTicket
}

// errClientGone marks an upstream stream closed because the client went away.
var errClientGone = errors.New("client disconnected")

// errNoSequence closes an upstream answer dropped because the call got no
// sequence id (settleSequence).
var errNoSequence = errors.New("answer dropped: no sequence id could be reserved")

// errRetried closes an upstream answer dropped for another attempt.
var errRetried = errors.New("answer dropped: the call is retried")

// hop-by-hop and framing headers never copied between client and backend.
var skipHeaders = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true,
	"te": true, "trailer": true, "upgrade": true, "content-length": true, "host": true,
	"accept-encoding": true, "content-encoding": true, "proxy-authorization": true, "proxy-authenticate": true,
	"x-rollout-id": true, "x-attempt-id": true, "x-sequence-id": true, "x-request-id": true, "x-rollout-mode": true,
}

func lowerASCII(dst, b []byte) []byte {
	dst = dst[:0]
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// proxy handles an OpenAI route: attribution, rewriting, forwarding,
// streaming back, and capture.
func (s *Server) proxy(ctx *fasthttp.RequestCtx, attr attribution, ep openai.Endpoint, path []byte) {
	s.proxyWith(ctx, attr, ep, path, callOptions{force: s.forceFor(ctx, attr)})
}

// proxyWith is proxy with a mounted route's options (see ProxyAgent).
func (s *Server) proxyWith(ctx *fasthttp.RequestCtx, attr attribution, ep openai.Endpoint, path []byte, opts callOptions) {
	s.m.InFlight.Inc()
	defer s.m.InFlight.Dec()
	name, ok := s.admitCaller(ctx, attr, opts)
	if !ok {
		return
	}
	if opts.force == nil {
		opts.force = s.force
	}
	c := call{start: time.Now(), endpoint: ep, attr: attr, opts: opts}
	s.openCall(ctx, &c, path, name)
	body, model, fb, ok := s.readRequest(ctx, &c)
	if fb != nil {
		defer s.bufs.put(fb)
	}
	if !ok {
		return
	}
	pl, ok := s.routeModel(ctx, &c, model)
	if !ok || !s.waitIfPaused(ctx, &c) || !s.acquireSlot(ctx, &c) {
		return
	}
	s.admitAhead(ctx, &c)
	s.forward(ctx, &c, pl, path, body)
}

// admitCaller checks the caller: its API key (admissible), or for a mounted
// route that checks no key, its attribution ids. It returns the key's name.
func (s *Server) admitCaller(ctx *fasthttp.RequestCtx, attr attribution, opts callOptions) (name string, ok bool) {
	if !opts.noKeyCheck {
		return s.admissible(ctx, attr)
	}
	if msg := attributionError(attr, attr.fromPath); msg != "" {
		s.reject(ctx, &call{opts: opts}, rejectInvalidID, fasthttp.StatusBadRequest, errInvalidRequest, msg)
		return "", false
	}
	return "", true
}

// openCall starts capturing c: its Pending, with the request body as the
// client sent it, and its trace.
func (s *Server) openCall(ctx *fasthttp.RequestCtx, c *call, path []byte, keyName string) {
	p := s.capture.AcquirePending()
	c.pend = p
	p.Endpoint = c.endpoint
	s.beginCall(ctx, p, path, c.start)
	if c.opts.endpoint != openai.Unknown {
		p.Meta.Endpoint = c.opts.endpoint.String()
	}
	if s.tracing != nil {
		s.tracing.begin(ctx, c)
	}
	body := ctx.PostBody()
	p.Request = string(body) // the call's one copy of it (Pending.Request)
	p.Meta.APIKeyName = keyName
	p.NoBodies = c.endpoint == openai.Embeddings && !s.cfg.CaptureEmbeddingBodies
}

// readRequest validates the request body once for the whole call (Rewrite
// is told), applies the forced fields, and returns the body to send and its
// model name. fb, when not nil, holds the forced body: the caller puts it
// back in the pool when the call is done. ok false: the client was answered
// (400).
func (s *Server) readRequest(ctx *fasthttp.RequestCtx, c *call) (body, model []byte, fb *[]byte, ok bool) {
	body = ctx.PostBody()
	modelRaw, err := rewrite.Inspect(body)
	switch {
	case errors.Is(err, jsonscan.ErrTooDeep):
		// Refused, not captured: a stored body this deep would reach every
		// reader of request_body (issue 36: it killed the gateway).
		s.reject(ctx, c, rejectTooDeep, fasthttp.StatusBadRequest, errInvalidRequest, "request body: "+err.Error())
		return nil, nil, nil, false
	case err != nil:
		s.fail(ctx, c, fasthttp.StatusBadRequest, errInvalidRequest, notObjectMessage(body, ctx.Request.Header.ContentType()))
		return nil, nil, nil, false
	}
	if rec := c.opts.force.Record(); rec != "" {
		// Forced fields replace the client's; request_body keeps what the
		// client sent and the overrides column what was forced.
		fb = s.bufs.get()
		forced, err := c.opts.force.Force((*fb)[:0], body)
		if err != nil {
			s.fail(ctx, c, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
			return nil, nil, fb, false
		}
		*fb, body = forced, forced
		c.pend.Meta.Overrides = rec
		modelRaw, _ = rewrite.Inspect(body)
	}
	model = modelName(modelRaw)
	if len(model) == 0 {
		s.fail(ctx, c, fasthttp.StatusBadRequest, errInvalidRequest, `"model" must be a non-empty string`)
		return nil, nil, fb, false
	}
	return body, model, fb, true
}

// routeModel finds the pool serving model (a mounted route's own pool
// first, then the routes, then the wildcard) and names the call's model.
// ok false: no pool serves it and the client was answered 404.
func (s *Server) routeModel(ctx *fasthttp.RequestCtx, c *call, model []byte) (pl *backends.Pool, ok bool) {
	t := s.backends.Load()
	pl = t.Pool(model)
	if c.opts.pool != nil {
		pl = c.opts.pool
	}
	switch {
	case pl != nil && string(model) != pl.Model():
		c.model = s.modelNames.get(model) // a mounted pool serves any name
	case pl != nil:
		c.model = pl.Model() // the routed name: no copy per call
	case t.Wildcard() != nil:
		pl = t.Wildcard()
		c.model = s.modelNames.get(model)
	default:
		// Not interned: names that match no route must not grow memory.
		c.model = string(model[:min(len(model), MaxNameLen)])
		c.pend.Meta.Model = c.model
		s.fail(ctx, c, fasthttp.StatusNotFound, errNotFound,
			fmt.Sprintf("The model `%s` does not exist or is not routed by this gateway (see GET /v1/models).", truncate(c.model, 128)))
		return nil, false
	}
	c.pend.Meta.Model = c.model
	return pl, true
}

// forward sends the call to a replica of pl (attemptUpstream) and relays
// the answer. It holds the concurrency slot acquireSlot took until an
// answer is in hand; from there the slot is released when the response is
// complete (for a stream: when the stream writer ends).
func (s *Server) forward(ctx *fasthttp.RequestCtx, c *call, pl *backends.Pool, path, body []byte) {
	slotHeld := true
	defer func() {
		if slotHeld {
			s.releaseSlot()
		}
	}()
	out := s.bufs.get()
	defer s.bufs.put(out)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	a, ok := s.attemptUpstream(ctx, c, pl, path, body, out, req)
	if !ok {
		return
	}
	// The engine has the call and no attempt follows: the client's request
	// body (capture keeps its own copy, Pending.Request) goes back to
	// fasthttp's pool now, not when the response has been written — for a
	// stream, at its end, an agent's whole context held for the stream's life.
	ctx.Request.ResetBody()
	slotHeld = false
	s.relay(ctx, c, a, path)
}

// answer is the upstream response a call relays.
type answer struct {
	r    *backends.Upstream // the replica that gave it (acquired)
	resp *fasthttp.Response
	inj  rewrite.Injected // what Rewrite injected into the request
}

// retryBudget is what is left of a call's attempts.
type retryBudget struct {
	deadline time.Time // the call's upstream deadline
	backoff  time.Duration
	retries  int
	tried    []*backends.Upstream // replicas tried (their answers were not kept)
}

// attemptUpstream sends the call to pl's replicas until one answers: a
// transport error is retried on another replica (Config.Retries, with a
// doubling backoff, within the call's deadline), and so is a retryable
// status on a mounted route that asks for it. ok false: the client was
// answered and there is nothing to relay.
func (s *Server) attemptUpstream(ctx *fasthttp.RequestCtx, c *call, pl *backends.Pool, path, body []byte, out *[]byte, req *fasthttp.Request) (answer, bool) {
	b := retryBudget{deadline: c.start.Add(s.cfg.UpstreamTimeout), backoff: s.cfg.RetryBackoff, retries: s.cfg.Retries}
	if c.opts.retries > 0 {
		b.retries = c.opts.retries
	}
	if c.opts.backoff > 0 {
		b.backoff = c.opts.backoff
	}
	for attempt := 0; ; attempt++ {
		r := s.pick(pl, c.attr.rolloutID, b.tried)
		if r == nil { // every replica tried once: start over
			b.tried = b.tried[:0]
			r = s.pick(pl, c.attr.rolloutID, nil)
		}
		rewritten, info, inj, ok := s.rewriteFor(ctx, c, r, attempt, body, out)
		if !ok {
			return answer{}, false
		}
		resp, hungUp, err := s.send(ctx, c, pl, r, attempt, path, req, rewritten, info, b.deadline)
		if hungUp {
			return answer{}, false
		}
		if err != nil {
			if !s.attemptFailed(ctx, c, r, resp, err, attempt, &b) {
				return answer{}, false
			}
			time.Sleep(b.backoff)
			b.backoff *= 2
			continue
		}
		if !bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
			r.MarkSuccess() // a stream's verdict is its end (streamBody.endStream)
		}
		code := resp.StatusCode()
		if !c.opts.retryStatus || !retryableStatus(code) || attempt >= b.retries || time.Now().Add(b.backoff).After(b.deadline) {
			return answer{r: r, resp: resp, inj: inj}, true
		}
		// A status worth another attempt (a mounted route's policy).
		s.release(r)
		abortResponse(resp, errRetried)
		b.tried = append(b.tried, r)
		s.log.Debug("backend answered a retryable status; retrying", "backend", r.Name(), "status", code, "attempt", attempt+1)
		time.Sleep(b.backoff)
		b.backoff = min(b.backoff*2, maxRetryBackoff)
	}
}

// rewriteFor rewrites the body for replica r into out (rewrite.Rewrite,
// then the model name r serves) and records the attempt in the call's row.
// ok false: the body was refused and the client answered 400.
func (s *Server) rewriteFor(ctx *fasthttp.RequestCtx, c *call, r *backends.Upstream, attempt int, body []byte, out *[]byte) (rewritten []byte, info rewrite.Request, inj rewrite.Injected, ok bool) {
	kind := r.Kind()
	rewritten, info, inj, err := rewrite.Rewrite((*out)[:0], body, c.endpoint, kind, rewrite.Options{Logprobs: s.cfg.InjectLogprobs, IDsFromLogprobs: r.IDsFromLogprobs(kind), Validated: true})
	if err != nil {
		s.fail(ctx, c, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
		return nil, info, 0, false
	}
	if !sameStart(rewritten, body) { // never pool the request's own buffer
		*out = rewritten
	}
	spec := r.Spec()
	if spec.ServedModel != "" {
		rewritten = replaceModel(rewritten, spec.ServedModel)
	}
	p := c.pend
	p.Meta.Backend = r.Name()
	p.Engine = r.Engine()
	p.Meta.BackendAttempts = uint16(min(attempt+1, math.MaxUint16))
	p.Meta.PolicyVersion = spec.PolicyVersion
	p.Meta.Stream = info.Stream
	p.N = info.N
	return rewritten, info, inj, true
}

// send sends the rewritten request to replica r (counted outstanding on it)
// and returns its response, streamed when the call is. A call admitted
// without its sequence id (admitAhead) takes it once the engine answered.
// hungUp true: the client hung up on a non-streamed call meanwhile (hungUp
// answered for it), or no sequence id could be reserved (answered 503); r
// and the response were released.
func (s *Server) send(ctx *fasthttp.RequestCtx, c *call, pl *backends.Pool, r *backends.Upstream, attempt int, path []byte, req *fasthttp.Request, rewritten []byte, info rewrite.Request, deadline time.Time) (resp *fasthttp.Response, hungUp bool, err error) {
	req.Reset()
	s.buildUpstream(ctx, req, r, path, rewritten)
	resp = fasthttp.AcquireResponse()
	resp.StreamBody = info.Stream
	s.acquire(r)
	if c.tr.span != nil {
		s.tracing.attemptStart(c, r, attempt, path)
	}
	hw, err := s.exchange(ctx, c, pl, r, info, req, resp, rewritten, deadline)
	if c.seq.t != nil && !s.settleSequence(ctx, c) {
		hw.stop()
		s.release(r)
		abortResponse(resp, errNoSequence)
		return nil, true, err
	}
	if hw.stop() {
		if err == nil {
			r.MarkSuccess()
		}
		s.release(r)
		fasthttp.ReleaseResponse(resp)
		s.hungUp(ctx, c, r, err)
		return nil, true, err
	}
	return resp, false, err
}

// exchange makes the round trip to replica r: in token-in mode through
// serveTokenIn, otherwise one HTTP request. A non-streamed call, token-in
// or not, is watched for the client hanging up meanwhile (hw; nil for a
// stream: its streamBody sees the client go).
func (s *Server) exchange(ctx *fasthttp.RequestCtx, c *call, pl *backends.Pool, r *backends.Upstream, info rewrite.Request, req *fasthttp.Request, resp *fasthttp.Response, rewritten []byte, deadline time.Time) (hw *hangupWatch, err error) {
	if !info.Stream { // nil for streams (streamBody sees the client go)
		hw = s.watchHangup(ctx, req, deadline)
	}
	if s.tokenInOn(pl, c.endpoint) {
		err = s.serveTokenIn(c, r, info, req, resp, rewritten, deadline, hw)
	} else if info.Stream {
		err = s.transport.doStream(r.Client(), req, resp, deadline)
	} else {
		err = r.Client().DoDeadline(req, resp, deadline)
	}
	return hw, err
}

// attemptFailed books an attempt on replica r that failed with err before
// any response (resp is released, r marked failed and added to b.tried)
// and says whether to retry; when not, the client is answered with the
// error.
func (s *Server) attemptFailed(ctx *fasthttp.RequestCtx, c *call, r *backends.Upstream, resp *fasthttp.Response, err error, attempt int, b *retryBudget) (retry bool) {
	s.release(r)
	fasthttp.ReleaseResponse(resp)
	err = s.unackedCause(r, err)
	if staleConn(err) {
		// The replica closed a kept-alive connection that the pool
		// still held: uvicorn (vLLM's and SGLang's server) closes one
		// idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default. The
		// pool's other idle connections are as old, so they go too and
		// the retry dials afresh instead of meeting the next stale one.
		r.Client().CloseIdleConnections()
	}
	r.MarkFailure(s.cfg.UnhealthyAfter, s.cfg.UnhealthyCooldown)
	b.tried = append(b.tried, r)
	retry = attempt < b.retries && retryable(err) && !time.Now().Add(b.backoff).After(b.deadline)
	if c.tr.attempt != nil {
		s.tracing.attemptFailed(c, err, retry)
	}
	if !retry {
		status, typ := upstreamStatus(err)
		s.fail(ctx, c, status, typ, s.attemptError(c, r, err, attempt))
		return false
	}
	s.log.Debug("backend call failed before any response; retrying", "backend", r.Name(), "attempt", attempt+1, "err", err)
	return true
}

// attemptError is the message of a call whose last attempt, on replica r,
// failed with err.
func (s *Server) attemptError(c *call, r *backends.Upstream, err error, attempt int) string {
	msg := fmt.Sprintf("backend %s: %v", r.Name(), err)
	if c.opts.engineOnly {
		msg = fmt.Sprintf("backend %s: %s", r.Name(), transportFailure(err))
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		msg = fmt.Sprintf("backend %s: response body larger than %d bytes (raise max_response_body_bytes)", r.Name(), s.cfg.MaxResponseBodyBytes)
	}
	if attempt > 0 {
		msg = fmt.Sprintf("%s (after %d attempts)", msg, attempt+1)
	}
	return msg
}

// relay answers the client with the upstream answer: a stream through a
// streamBody, which ends the call, otherwise the whole body (relayBody).
// The concurrency slot is the caller's no more: it is released when the
// response is complete.
func (s *Server) relay(ctx *fasthttp.RequestCtx, c *call, a answer, path []byte) {
	status := a.resp.StatusCode()
	c.pend.Meta.HTTPStatus = uint16(status)
	sse := bytes.HasPrefix(a.resp.Header.ContentType(), []byte("text/event-stream"))
	if c.opts.engineOnly && !(sse && status < 300 && c.pend.Meta.Stream) && !jsonContentType(a.resp.Header.ContentType()) {
		s.withhold(ctx, c, a.r, a.resp, "")
		return
	}
	if sse {
		ctx.SetStatusCode(status)
		copyResponseHeaders(ctx, a.resp)
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.Response.Header.Set("X-Accel-Buffering", "no")
		sb := s.newStreamBody(c, a.resp, a.inj, a.r, ctx.Conn())
		if c.opts.wrapStream != nil {
			// The client's bytes are the wrapper's: fasthttp writes them.
			ctx.Response.SetBodyStream(c.opts.wrapStream(sb), -1)
			return
		}
		s.hijackStream(ctx, sb)
		return
	}
	s.relayBody(ctx, c, a, status, path)
}

// relayBody relays a non-streamed answer: it reads the whole body, strips
// what the gateway injected, sends it, releases the replica and the
// concurrency slot, and ends the call.
func (s *Server) relayBody(ctx *fasthttp.RequestCtx, c *call, a answer, status int, path []byte) {
	p, r, resp := c.pend, a.r, a.resp
	var rerr error
	p.Body, rerr = appendBody(p.Body[:0], resp, s.cfg.MaxResponseBodyBytes)
	if rerr == nil && c.opts.engineOnly && !jsonObject(p.Body) {
		s.withhold(ctx, c, r, resp, "not a JSON object")
		return
	}
	if rerr == nil {
		ctx.SetStatusCode(status)
		copyResponseHeaders(ctx, resp)
	}
	if rerr != nil {
		abortResponse(resp, rerr)
	} else {
		fasthttp.ReleaseResponse(resp)
	}
	s.release(r)
	s.releaseSlot()
	if rerr != nil {
		status, typ := upstreamStatus(rerr)
		s.fail(ctx, c, status, typ, fmt.Sprintf("backend %s: reading response: %v", r.Name(), rerr))
		return
	}
	if a.inj != 0 && status < 300 {
		sb := s.bufs.get()
		stripped := rewrite.StripBody((*sb)[:0], p.Body, c.endpoint, a.inj)
		ctx.Response.SetBody(stripped)
		// StripBody returns p.Body itself when it changes nothing (or cannot
		// parse it): that array belongs to capture and must not enter the pool.
		if !sameStart(stripped, p.Body) {
			*sb = stripped
		}
		s.bufs.put(sb)
	} else {
		ctx.Response.SetBody(p.Body)
	}
	if status >= 400 {
		s.noteBackendError(c, r, status, path)
	}
	s.finish(c, time.Now())
}

// noteBackendError records in the call's row why replica r answered the
// error status, with the engine's own message; a 404 from an engine without
// the route says so (and is logged once per replica).
func (s *Server) noteBackendError(c *call, r *backends.Upstream, status int, path []byte) {
	p := c.pend
	p.Meta.Error = "backend returned HTTP " + strconv.Itoa(status)
	if msg := gjson.GetBytes(p.Body, "error.message").String(); msg != "" {
		p.Meta.Error += ": " + truncate(msg, 500)
	} else if msg := gjson.GetBytes(p.Body, "message").String(); msg != "" {
		p.Meta.Error += ": " + truncate(msg, 500)
	}
	if status == fasthttp.StatusNotFound && routeMissing(p.Body, r) {
		// The engine has no such route, most often a replica URL
		// without /v1: said in the row and logged once per replica.
		hint := r.PathHint(status)
		route := r.BasePath() + strings.TrimPrefix(string(path), "/v1")
		p.Meta.Error += " (the engine has no route " + route + ")"
		if hint != "" {
			p.Meta.Error += ": " + hint
		}
		if r.NoteBare404() {
			s.log.Warn("a replica answered a call 404 Not Found (no such route): calls to it fail", "replica", r.Name(),
				"url", r.URL(), "path", route, "hint", hint)
		}
	}
}

// acquire and release count a call outstanding on a replica.
func (s *Server) acquire(r *backends.Upstream) {
	r.Acquire()
	s.m.BackendInFlight.WithLabelValues(r.Name()).Inc()
}

func (s *Server) release(r *backends.Upstream) {
	r.Release()
	s.m.BackendInFlight.WithLabelValues(r.Name()).Dec()
}

// abortResponse closes a streamed upstream response without returning its
// connection to the pool (it may hold unread bytes). The Response object is
// left to the garbage collector: releasing it would close the stream twice.
func abortResponse(resp *fasthttp.Response, cause error) {
	if rc, ok := resp.BodyStream().(fasthttp.ReadCloserWithError); ok {
		_ = rc.CloseWithError(cause)
		return
	}
	fasthttp.ReleaseResponse(resp)
}

// readAll reads a (possibly streamed) response body up to limit bytes.
func readAll(resp *fasthttp.Response, limit int) ([]byte, error) {
	return appendBody(nil, resp, limit)
}

// appendBody appends a (possibly streamed) response body to dst, reading at
// most limit bytes; a longer body is an error.
func appendBody(dst []byte, resp *fasthttp.Response, limit int) ([]byte, error) {
	bs := resp.BodyStream()
	if bs == nil {
		return append(dst, resp.Body()...), nil
	}
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := bs.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst)-start > limit {
			return dst[:start+limit], fmt.Errorf("response body larger than %d bytes (raise max_response_body_bytes)", limit)
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// modelName decodes the raw "model" value Inspect found: the string's bytes
// (a view into the body unless it has escapes), or nil when it is not a string.
func modelName(raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' {
		return nil
	}
	if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 {
		return in
	}
	return []byte(gjson.ParseBytes(raw).Str)
}

// buildUpstream prepares the request to the backend: its URL, the client's
// headers minus hop-by-hop ones, the replica's credentials, the rewritten body.
func (s *Server) buildUpstream(ctx *fasthttp.RequestCtx, req *fasthttp.Request, r *backends.Upstream, path, body []byte) {
	uri := s.bufs.get()
	defer s.bufs.put(uri)
	u := append((*uri)[:0], r.Origin()...)
	u = append(u, r.BasePath()...)
	u = append(u, bytes.TrimPrefix(path, []byte("/v1"))...)
	if q := ctx.URI().QueryString(); len(q) > 0 {
		u = append(u, '?')
		u = append(u, q...)
	}
	*uri = u
	req.SetRequestURIBytes(u)
	req.Header.SetMethodBytes(ctx.Method())
	auth := r.Auth()
	var lower []byte
	for k, v := range ctx.Request.Header.All() {
		lower = lowerASCII(lower, k)
		if skipHeaders[string(lower)] {
			continue
		}
		if string(lower) == "authorization" && (auth != "" || !s.cfg.ForwardClientAuthorization) {
			continue
		}
		req.Header.AddBytesKV(k, v)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.SetBodyRaw(body)
}

func copyResponseHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response) {
	var lower []byte
	for k, v := range resp.Header.All() {
		lower = lowerASCII(lower, k)
		if skipHeaders[string(lower)] || string(lower) == "server" || string(lower) == "date" {
			continue
		}
		ctx.Response.Header.SetBytesKV(k, v)
	}
}

// beginCall fills the call's span and trace ids, timing and endpoint: what
// a call has from its arrival, before it is known to be admitted. The
// attribution and sequence id come later (admit), so that a call refused
// for authentication or by a limit takes no sequence id.
func (s *Server) beginCall(ctx *fasthttp.RequestCtx, p *capture.Pending, path []byte, start time.Time) {
	fillIDs(&p.IDs, ctx.Request.Header.Peek("traceparent"))
	p.Meta.StartTimeUnixNano = uint64(start.UnixNano())
	p.Meta.Endpoint = endpointName(p.Endpoint, path)
	ctx.Response.Header.SetBytesV("x-request-id", p.IDs.Span[:])
}

// admit attributes an admitted call to its rollout and attempt, gives it its
// sequence id and sets the attribution response headers (admitAhead, then
// settleSequence). It returns false, having answered 503 and released c's
// capture state, when no sequence id could be reserved (the sequence store
// is down or slow).
func (s *Server) admit(ctx *fasthttp.RequestCtx, c *call) bool {
	if c.pend == nil { // refused already (settleSequence answered 503)
		return false
	}
	s.admitAhead(ctx, c)
	return c.seq.t == nil || s.settleSequence(ctx, c)
}

// admitAhead is admit without waiting for the sequence store: a call whose
// attempt needs a new block of ids (its first call, or a used-up block)
// keeps the reservation's ticket in c.seq and goes on; it takes its id in
// settleSequence once the engine has answered (send), or before any other
// answer (fail), so the database's commit runs beside the engine's work.
// attr's ids have been validated (validAttribution), so they are safe in
// headers and rows.
func (s *Server) admitAhead(ctx *fasthttp.RequestCtx, c *call) {
	p, attr := c.pend, c.attr
	if p.Meta.SequenceID != 0 || c.seq.t != nil {
		return
	}
	e, seq, t := s.assignSequence(ctx, c)
	p.Meta.RolloutID, p.Meta.AttemptID = e.rollout, e.attempt
	p.Meta.TaskID = s.texts.get(attr.taskID)
	p.Meta.AgentName = s.texts.get(attr.agentName)
	if p.Meta.TaskID == "" && e.rollout != "" {
		p.Meta.TaskID = s.registeredTask(e)
	}
	if t != nil {
		c.seq.t = t
		return
	}
	s.setSequenceID(ctx, c, seq)
}

// settleSequence waits for the reservation admitAhead started and gives
// the call its id. It returns false, having answered 503 and released c's
// capture state, when the reservation failed: the call gets no id, no row,
// and the engine's answer (if any) is not returned.
func (s *Server) settleSequence(ctx *fasthttp.RequestCtx, c *call) bool {
	t := c.seq.t
	c.seq.t = nil
	_, seq, err := t.wait(s.m.SequenceWaits)
	if err != nil {
		s.log.Warn("refusing a call: no sequence id", "err", err)
		ctx.Response.Header.Set("Retry-After", "1")
		s.reject(ctx, c, rejectSequenceStore, fasthttp.StatusServiceUnavailable, errServer,
			"the gateway could not reserve a sequence id for this call (its database, --queue or --db, is down or slow; the gateway's log has the cause); no answer of the model was returned: retry")
		return false
	}
	s.setSequenceID(ctx, c, seq)
	return true
}

// setSequenceID gives the call its sequence id (its row's) and sets the
// attribution response headers: x-sequence-id, and x-rollout-id and
// x-attempt-id for an attributed call.
func (s *Server) setSequenceID(ctx *fasthttp.RequestCtx, c *call, seq uint64) {
	c.pend.Meta.SequenceID = seq
	h := &ctx.Response.Header
	if c.pend.Meta.RolloutID != "" {
		h.SetBytesV("x-rollout-id", c.attr.rolloutID)
		h.SetBytesV("x-attempt-id", c.attr.attemptID)
	}
	num := s.bufs.get()
	*num = strconv.AppendUint((*num)[:0], seq, 10)
	h.SetBytesV("x-sequence-id", *num)
	s.bufs.put(num)
}

// registeredTask returns the task id registered (POST /api/v1/rollouts) for
// the entry's rollout. The registry is consulted once per attempt;
// registering later sets the entry directly (see noteRegistered).
func (s *Server) registeredTask(e *seqEntry) string {
	if t := e.task.Load(); t != nil {
		return *t
	}
	if e.looked.Swap(true) {
		return ""
	}
	if ri, ok := s.rollouts.Load(e.rollout); ok {
		t := ri.(string)
		e.task.Store(&t)
		return t
	}
	return ""
}

// noteRegistered records a registered rollout's task id on every attempt
// entry the gateway has seen for it (calls made before the registration).
func (s *Server) noteRegistered(rolloutID, taskID string) {
	t := &taskID
	s.seq.forRollout(rolloutID, func(e *seqEntry) { e.task.Store(t) })
}

// fail answers with an OpenAI-style error and captures the call with it.
func (s *Server) fail(ctx *fasthttp.RequestCtx, c *call, status int, typ, msg string) {
	if !s.admit(ctx, c) {
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(nil)
	ctx.Response.SetBody(errorBody(ctx.Response.Body()[:0], c, status, typ, msg))
	c.pend.Meta.HTTPStatus = uint16(status)
	c.pend.Meta.Error = msg
	c.pend.Body = append(c.pend.Body[:0], ctx.Response.Body()...)
	s.finish(c, time.Now())
}

// Reasons a call is refused before it is admitted (rollgate_calls_rejected_total).
const (
	rejectUnauthenticated = "unauthenticated"
	rejectInvalidID       = "invalid_id"
	rejectConcurrency     = "concurrency_limit"
	rejectPaused          = "paused"
	rejectSequenceStore   = "sequence_store" // no sequence id could be reserved
	rejectTooDeep         = "json_depth"     // the body nests deeper than jsonscan.MaxDepth
	rejectUnattributed    = "unattributed"   // no rollout named, with Config.Unattributed "refuse"
)

// admissible checks what a call must pass before anything of it is kept:
// a valid client key (its name is returned) and valid attribution ids. A
// call that fails is answered and counted (reject) and never reaches a
// header, a log line, a sequence id or the store.
func (s *Server) admissible(ctx *fasthttp.RequestCtx, attr attribution) (keyName string, ok bool) {
	keyName, ok = s.clientKeyName(ctx)
	if !ok {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="rollgate"`)
		s.reject(ctx, nil, rejectUnauthenticated, fasthttp.StatusUnauthorized, "invalid_request_error",
			"Incorrect API key provided: send one of the gateway's client keys as Authorization: Bearer KEY (OPENAI_API_KEY)")
		return "", false
	}
	if msg := attributionError(attr, attr.fromPath); msg != "" {
		s.reject(ctx, nil, rejectInvalidID, fasthttp.StatusBadRequest, errInvalidRequest, msg)
		return "", false
	}
	if len(attr.rolloutID) == 0 && s.cfg.Unattributed == UnattributedRefuse {
		s.reject(ctx, nil, rejectUnattributed, fasthttp.StatusBadRequest, errInvalidRequest,
			"this call names no rollout: use the base URL "+s.cfg.PublicURL+"/rollout/{rollout_id}/attempt/{attempt_id}/v1"+
				" (or send the headers x-rollout-id and x-attempt-id); this gateway refuses unattributed calls (--unattributed refuse)")
		return "", false
	}
	if len(attr.rolloutID) == 0 && !s.toldUnattributed.Load() && !s.toldUnattributed.Swap(true) {
		s.log.Warn("a call named no rollout: captured with an empty rollout_id, listed as (unattributed) in /ui, never selected by the trainer bridge;"+
			" agents should use the base URL "+s.cfg.PublicURL+"/rollout/{rollout_id}/attempt/{attempt_id}/v1 (--unattributed refuse answers such calls 400; logged once)",
			"path", string(ctx.Path()))
	}
	return keyName, true
}

// reject answers a call refused before it was admitted with an OpenAI-style
// error and counts it. Nothing of it is captured: it takes no sequence id and
// stores no row under the rollout it names. c is nil when the call was
// refused before its capture state was made.
func (s *Server) reject(ctx *fasthttp.RequestCtx, c *call, reason string, status int, typ, msg string) {
	s.m.CallsRejected.WithLabelValues(reason).Inc()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(nil)
	ctx.Response.SetBody(errorBody(ctx.Response.Body()[:0], c, status, typ, msg))
	if c == nil || c.pend == nil {
		return
	}
	if c.tr.span != nil {
		c.pend.Meta.HTTPStatus = uint16(status)
		c.pend.Meta.Error = msg
		s.tracing.end(c, time.Now())
	}
	capture.ReleasePending(c.pend)
	c.pend = nil
}

// finish records metrics and hands the call to capture.
func (s *Server) finish(c *call, end time.Time) {
	p := c.pend
	p.Meta.EndTimeUnixNano = uint64(end.UnixNano())
	if c.tr.span != nil {
		s.tracing.end(c, end)
	}
	model := metricModel(p.Meta.Model, p.Meta.Backend)
	s.m.Requests.WithLabelValues(model, p.Meta.Backend, p.Meta.Endpoint, statusLabel(p.Meta.HTTPStatus)).Inc()
	s.m.RequestDuration.WithLabelValues(model, p.Meta.Endpoint, boolLabel(p.Meta.Stream)).Observe(end.Sub(c.start).Seconds())
	// On false the pipeline has counted and logged the drop; p is left to the GC.
	s.capture.TryPush(p)
	if c.opts.onEnd != nil {
		c.opts.onEnd()
	}
}

// routeMissing reports whether an engine's 404 says the route does not
// exist (a body without a message, or the frameworks' plain "Not Found":
// FastAPI's {"detail": "Not Found"}, vLLM's error of that message), rather
// than that a model or resource of a served route is unknown; or whether
// the replica's URL lacks /v1, where any 404 most likely means that.
func routeMissing(body []byte, r *backends.Upstream) bool {
	if !strings.HasSuffix(r.BasePath(), "/v1") {
		return true
	}
	msg := gjson.GetBytes(body, "error.message").String()
	if msg == "" {
		msg = gjson.GetBytes(body, "message").String()
	}
	if msg == "" {
		msg = gjson.GetBytes(body, "detail").String()
	}
	return msg == "" || strings.EqualFold(strings.TrimSpace(msg), "not found")
}

// statusLabels holds the label text of every HTTP status, so counting a call
// allocates nothing.
var statusLabels = func() (l [600]string) {
	for i := range l {
		l[i] = strconv.Itoa(i)
	}
	return l
}()

func statusLabel(code uint16) string {
	if int(code) < len(statusLabels) {
		return statusLabels[code]
	}
	return strconv.Itoa(int(code))
}

// metricModel is the model label: the requested name when it was routed,
// "unrouted" when no backend took it, "invalid" when it is not a sane label
// (invalid UTF-8 or over 128 bytes), so clients cannot break /metrics.
func metricModel(model, backend string) string {
	if backend == "" {
		return "unrouted"
	}
	return metrics.ModelLabel(model)
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// replaceModel rewrites "model" in a JSON body (for replicas serving the
// model under another name).
func replaceModel(body []byte, model string) []byte {
	res := gjson.GetBytes(body, "model")
	if res.Index <= 0 {
		return body
	}
	out := make([]byte, 0, len(body)+len(model))
	out = append(out, body[:res.Index]...)
	out = strconv.AppendQuote(out, model)
	return append(out, body[res.Index+len(res.Raw):]...)
}

// endpointName is the endpoint column: the route without the rollout prefix.
func endpointName(ep openai.Endpoint, path []byte) string {
	if n := ep.String(); n != "" {
		return n
	}
	return string(path)
}

// sameStart reports whether a and b are non-empty and start at the same
// byte, i.e. a function returned its input instead of its output buffer.
func sameStart(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}
