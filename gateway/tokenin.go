package gateway

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/gateway/tokenin"
	"github.com/rollgate/rollgate/internal/openai"
)

// The token-in endpoints are the engine kind's (engines.TokenIn; vLLM
// 0.32's render, generate, derender and abort_requests in engines/vllm).

// hasTokenIn says whether replica r's kind has token-in endpoints.
func hasTokenIn(r *backends.Upstream) bool {
	return tokenInOf(r) != nil
}

// tokenInOf is the token-in capability of replica r's kind (nil: it has
// none). The engine owns the requests' and answers' shapes; the gateway
// sends them (tokenInPost, startGenerate: the transport stays here, tied to
// the hang-up watch, the stale-connection retry and the replica's pooled
// client).
func tokenInOf(r *backends.Upstream) engines.TokenIn {
	ti, _ := engines.Lookup(r.Kind()).(engines.TokenIn)
	return ti
}

// errTokenIn marks an engine answer token-in mode cannot use.
var errTokenIn = errors.New("token-in")

// tokenInOn says whether token-in mode applies to a chat call to pool pl.
func (s *Server) tokenInOn(pl *backends.Pool, ep openai.Endpoint) bool {
	if ep != openai.ChatCompletions || s.tokenIn == nil {
		return false
	}
	if on := pl.TokenIn(); on != nil {
		return *on
	}
	return s.cfg.TokenIn
}

// tokenInKinds refuses a routing table where token-in mode is on (the
// gateway's setting, or a backend's) for a replica whose configured engine
// kind has no token-in endpoints.
func tokenInKinds(global bool, bs []Backend) error {
	for i, b := range bs {
		on := global
		if b.TokenIn != nil {
			on = *b.TokenIn
		}
		for j, r := range b.Replicas {
			if err := backends.TokenInKind(on, r.Kind); err != nil {
				return fmt.Errorf("backends[%d].replicas[%d] (model %q): %w (--token-in is on)", i, j, b.Model, err)
			}
		}
	}
	return nil
}

// noteTokenIn records how token-in mode served the call and counts it.
func (s *Server) noteTokenIn(c *call, outcome string) {
	c.pend.Meta.TokenIn = outcome
	s.m.TokenIn.WithLabelValues(outcome).Inc()
}

// tokenInFailed records the outcome of a call whose generate request
// failed: in the row, and counted when the call ends there (the client hung
// up); another failure may be retried, and the retry counts.
func (s *Server) tokenInFailed(c *call, outcome string, err error) {
	if errors.Is(err, errClientGone) {
		s.noteTokenIn(c, outcome)
		return
	}
	c.pend.Meta.TokenIn = outcome
}

// serveTokenIn sends a chat call to replica r in token-in mode and leaves
// in resp the kind's chat completion as the ordinary path would have received
// it with body's injected fields (prompt_token_ids, choices[].token_ids,
// logprobs), so stripping and capture treat it alike. A call it cannot
// serve so (see tokenin's Reason constants) goes the ordinary way: req
// (already built from body) is sent as it is. The error is a transport
// error of the last engine request, for the caller's retry policy.
func (s *Server) serveTokenIn(c *call, r *backends.Upstream, info rewrite.Request, req *fasthttp.Request, resp *fasthttp.Response, body []byte, deadline time.Time, hw *hangupWatch) error {
	pass := func(reason string) error {
		s.noteTokenIn(c, tokenin.PassthroughPrefix+reason)
		return r.Client().DoDeadline(req, resp, deadline)
	}
	ti := tokenInOf(r)
	switch {
	case ti == nil:
		return pass(tokenin.ReasonKind)
	case len(c.attr.rolloutID) == 0 || len(c.attr.attemptID) == 0:
		return pass(tokenin.ReasonNoAttempt)
	}
	msgsRaw := gjson.GetBytes(body, "messages")
	msgs, err := tokenin.Canonical([]byte(msgsRaw.Raw))
	if err != nil || len(msgs) == 0 {
		return pass(tokenin.ReasonBadMessages)
	}
	renderKey := tokenin.RenderKey(body)
	key := tokenin.Key(string(c.attr.rolloutID), string(c.attr.attemptID))
	prev := s.tokenIn.Get(key)

	rendered, err := s.tokenInRender(r, ti, body, deadline, hw)
	if err != nil {
		s.log.Warn("token-in: render failed; passing the call through", "backend", r.Name(), "err", err)
		return pass(tokenin.ReasonRender)
	}
	outcome, prompt := tokenin.First, rendered.ids
	if prev != nil {
		outcome = tokenin.WholePrefix
		// A cut answer (why is ReasonNotEnded) is joined with the closing
		// the template renders after it (tokenin.JoinCut), when exact.
		join, fail := tokenin.Join, tokenin.ReasonJoin
		choice, why := tokenin.Check(prev, msgs, renderKey)
		if why == tokenin.ReasonNotEnded {
			join, fail = tokenin.JoinCut, tokenin.ReasonNotEnded
		}
		if why != "" && why != tokenin.ReasonNotEnded {
			outcome += why
		} else if closed, err := s.tokenInRender(r, ti, closedHistory(body, msgsRaw, len(prev.Messages)+1), deadline, hw); err != nil {
			outcome += fail
		} else if joined, ok := join(make([]uint32, 0, len(prev.Prompt)+len(prev.Choices[choice].Response)+len(rendered.ids)), prev, choice, closed.ids, rendered.ids); ok {
			outcome, prompt = tokenin.Extended, joined
		} else {
			outcome += fail
		}
	}
	genBody := rendered.raw
	put := func(choices []tokenin.Choice) {
		s.tokenIn.Put(key, &tokenin.Prev{Messages: msgs, RenderKey: renderKey, Prompt: prompt, Choices: choices})
	}
	if info.Stream {
		return s.serveTokenInStream(c, r, ti, resp, tokenInStreamCall{genBody: genBody, prompt: prompt, chatReq: body, outcome: outcome, deadline: deadline, from: req, n: info.N, put: put})
	}
	var rs *resumeState
	var opts engines.GenerateOptions
	if info.N <= 1 { // resumable after a pause in mode abort (resume.go)
		rs = newResumeState(c, r)
		opts.RequestID = rs.id
	}
	if genBody, err = ti.GenerateBody(genBody, prompt, opts); err != nil {
		return pass(tokenin.ReasonRender)
	}
	gen, parsed, status, err := s.tokenInGenerate(r, ti, genBody, prompt, rs, deadline, hw, req)
	if err != nil {
		s.tokenInFailed(c, outcome, err)
		return err
	}
	if status != fasthttp.StatusOK {
		// The engine's own error (a prompt over the context, bad sampling
		// parameters) reaches the client as it is.
		s.noteTokenIn(c, outcome)
		resp.SetStatusCode(status)
		resp.Header.SetContentType("application/json")
		resp.SetBody(gen)
		return nil
	}
	der, err := s.tokenInDerender(r, ti, gen, prompt, body, deadline, hw)
	if err != nil {
		s.log.Warn("token-in: derender failed; passing the call through", "backend", r.Name(), "err", err)
		return pass(tokenin.ReasonDerender)
	}
	s.noteTokenIn(c, outcome)
	resp.SetStatusCode(fasthttp.StatusOK)
	resp.Header.SetContentType("application/json")
	resp.SetBodyRaw(der)

	// Each choice's answer (n > 1: the agent sends one back), by index.
	if parsed == nil {
		g, err := ti.ParseGenerate(gen)
		if err != nil {
			return nil // nothing to extend next time: the next call renders whole
		}
		parsed = &g
	}
	generated := *parsed
	derChoices := gjson.GetBytes(der, "choices").Array()
	if len(generated.Choices) != len(derChoices) || len(derChoices) != max(info.N, 1) {
		return nil // nothing to extend next time: the next call renders whole
	}
	choices := make([]tokenin.Choice, len(derChoices))
	for _, g := range generated.Choices {
		i := g.Index
		d := derChoices[min(max(i, 0), len(derChoices)-1)]
		answer, err := tokenin.CanonicalAnswer([]byte(d.Get("message").Raw))
		if i < 0 || i >= len(choices) || d.Get("index").Int() != int64(i) || err != nil || choices[i].Answer != "" {
			return nil
		}
		choices[i] = tokenin.Choice{Answer: answer, Response: g.IDs, Ended: g.EndedOnTurn}
	}
	put(choices)
	return nil
}

// renderedPrompt is a render answer: the generate request and its ids.
type renderedPrompt struct {
	raw []byte
	ids []uint32
}

// tokenInRender renders a chat request with the engine's template.
func (s *Server) tokenInRender(r *backends.Upstream, ti engines.TokenIn, body []byte, deadline time.Time, hw *hangupWatch) (renderedPrompt, error) {
	out, status, err := s.tokenInPost(r, r.Origin()+r.BasePath()+ti.TokenInPaths().Render, body, deadline, hw, nil)
	if err != nil {
		return renderedPrompt{}, err
	}
	if status != fasthttp.StatusOK {
		return renderedPrompt{}, fmt.Errorf("%w: render answered HTTP %d: %s", errTokenIn, status, truncate(string(out), 300))
	}
	raw, ids, err := ti.RenderAnswer(out, body)
	if err != nil {
		return renderedPrompt{}, err
	}
	return renderedPrompt{raw: raw, ids: ids}, nil
}

// tokenInDerender turns a generate answer into the chat completion the
// ordinary path would have received (the engine's DerenderBody and
// DerenderAnswer).
func (s *Server) tokenInDerender(r *backends.Upstream, ti engines.TokenIn, gen []byte, prompt []uint32, chatReq []byte, deadline time.Time, hw *hangupWatch) ([]byte, error) {
	body, err := ti.DerenderBody(gen, prompt, chatReq)
	if err != nil {
		return nil, err
	}
	out, status, err := s.tokenInPost(r, r.Origin()+r.BasePath()+ti.TokenInPaths().Derender, body, deadline, hw, nil)
	if err != nil {
		return nil, err
	}
	if status != fasthttp.StatusOK || !gjson.ValidBytes(out) {
		return nil, fmt.Errorf("%w: derender answered HTTP %d: %s", errTokenIn, status, truncate(string(out), 300))
	}
	return ti.DerenderAnswer(out, gen, prompt, chatReq)
}

// tokenInPost POSTs a JSON body to the replica and returns the answer's
// body and status. With hw (a non-streamed call's hang-up watch) the
// request is cancellable: the client hanging up closes its backend
// connection (the engine aborts the generation) and the call fails with
// errHungUp.
func (s *Server) tokenInPost(r *backends.Upstream, url string, body []byte, deadline time.Time, hw *hangupWatch, from *fasthttp.Request) ([]byte, int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	tokenInRequest(req, r, url, body, from)
	if hw != nil {
		if hw.gone.Load() {
			return nil, 0, errHungUp
		}
		hw.t.calls.Store(req, hw)
		defer hw.t.calls.Delete(req)
	}
	err := r.Client().DoDeadline(req, resp, deadline)
	if err != nil && staleConn(err) {
		// A kept-alive connection the engine closed meanwhile (uvicorn
		// closes idle ones after 5 s; see proxyWith): once more, dialled
		// afresh.
		r.Client().CloseIdleConnections()
		resp.Reset()
		err = r.Client().DoDeadline(req, resp, deadline)
	}
	if err != nil {
		return nil, 0, err
	}
	if len(resp.Body()) > s.cfg.MaxResponseBodyBytes {
		return nil, 0, fmt.Errorf("%w: answer larger than %d bytes (raise max_response_body_bytes)", errTokenIn, s.cfg.MaxResponseBodyBytes)
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// tokenInRequest sets req up as a JSON POST of body to url on replica r.
// With from (the call's upstream request, headers already filtered by
// buildUpstream) its headers go along, as on the ordinary path: a generate
// request carries the client's X-Request-Id and the like.
func tokenInRequest(req *fasthttp.Request, r *backends.Upstream, url string, body []byte, from *fasthttp.Request) {
	if from != nil {
		for k, v := range from.Header.All() {
			if !strings.EqualFold(string(k), "Content-Length") && !strings.EqualFold(string(k), "Host") {
				req.Header.AddBytesKV(k, v)
			}
		}
	}
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if a := r.Auth(); a != "" {
		req.Header.Set("Authorization", a)
	}
	req.SetBodyRaw(body)
}

// closedHistory is the render request of the history up to and including
// message n-1 (the answer returned), without a generation prompt: the
// template's rendering of the turn's end, which tokenin.Join aligns with.
// tool_choice goes (a forced tool choice asks for a generation).
func closedHistory(body []byte, msgs gjson.Result, n int) []byte {
	arr := make([]byte, 0, len(msgs.Raw))
	arr = append(arr, '[')
	i := 0
	msgs.ForEach(func(_, m gjson.Result) bool {
		if i > 0 {
			arr = append(arr, ',')
		}
		arr = append(arr, m.Raw...)
		i++
		return i < n
	})
	arr = append(arr, ']')
	out, err := sjson.SetRawBytes(append([]byte(nil), body...), "messages", arr)
	if err != nil {
		return body
	}
	out, _ = sjson.SetBytes(out, "add_generation_prompt", false)
	out, _ = sjson.DeleteBytes(out, "tool_choice")
	return out
}
