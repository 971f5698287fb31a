package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// Mount serves every path under prefix that the gateway does not serve
// itself (its OpenAI routes, /v1/models, /metrics, /healthz, /readyz,
// /v1/traces and /api/v1/ come first) with h. A compatibility surface such
// as Agent Lightning's (controlplane/agl: /api/rollouts..., /proxy/...)
// mounts itself here and hands its model calls back to ProxyAgent. Call it
// before Serve; the first matching prefix wins. o says whether the surface
// answers without a credential: the gateway then refuses cross-site
// requests and foreign Hosts on it, outside o.AgentPrefix (crosssite.go).
func (s *Server) Mount(prefix string, h fasthttp.RequestHandler, o MountOptions) {
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	var next []mount
	if old := s.mounts.Load(); old != nil {
		next = append(next, *old...)
	}
	next = append(next, mount{prefix: prefix, h: h, o: o})
	s.mounts.Store(&next)
}

// mount is one Mount.
type mount struct {
	prefix string
	h      fasthttp.RequestHandler
	o      MountOptions
}

// serveMounted answers path with a mounted handler, if one matches.
func (s *Server) serveMounted(ctx *fasthttp.RequestCtx, path []byte) bool {
	ms := s.mounts.Load()
	if ms == nil {
		return false
	}
	for _, m := range *ms {
		if !strings.HasPrefix(string(path), m.prefix) {
			continue
		}
		agent := m.o.AgentPrefix != "" && strings.HasPrefix(string(path), m.o.AgentPrefix)
		if !agent && s.guarded(ctx, surface{open: m.o.Open, refuse: m.o.Refuse, credential: m.o.Credential}) {
			return true
		}
		m.h(ctx)
		return true
	}
	return false
}

// AgentCall is a model call that a mounted route hands to the gateway's
// proxy path (ProxyAgent): the call is attributed, given its sequence id,
// routed (rollout-affine), retried, streamed and captured into llm_calls
// exactly as a call on /rollout/{r}/attempt/{a}/v1/... is.
type AgentCall struct {
	// RolloutID and AttemptID attribute the call (valid ids: ValidID).
	RolloutID, AttemptID string
	// Endpoint is openai.ChatCompletions or openai.Completions.
	Endpoint openai.Endpoint
	// Force sets request fields whatever the client sent (the served model
	// name, per-mode sampling); they are recorded in the row's overrides
	// column. Nil: the gateway's own Config.Force applies.
	Force *rewrite.ForceSet
	// DetailErrors makes the errors the gateway answers itself FastAPI-style
	// ({"detail": "..."}) instead of OpenAI-style.
	DetailErrors bool
	// Done, when set, is called once when the call has ended: its response
	// sent (for a stream, its last byte written or the client gone).
	Done func()
	// Retries, when > 0, replaces Config.Retries for this call, and
	// RetryBackoff (> 0) Config.RetryBackoff; the wait doubles up to 8 s.
	Retries      int
	RetryBackoff time.Duration
	// RetryStatuses also retries answers with status 408, 409, 429 or 5xx
	// (Agent Lightning's proxy policy); after the last attempt the answer
	// is passed through.
	RetryStatuses bool
	// Pool, when set, serves the call whatever model it names: a pool of
	// the mounting surface's own table (NewMountedBackends). Nil: the
	// gateway's routing table, by model.
	Pool *backends.Pool
	// EngineAnswersOnly passes on only what an inference engine answers:
	// a JSON object (any status) or, to a call that asked for a stream, a
	// 2xx event stream. Anything else (an
	// HTML page, plain text, invalid JSON, something that is not HTTP) is
	// answered 502 naming the status and content type, never the body,
	// the headers or the transport error's text, and captured so. For
	// endpoints that the operator did not configure (Agent Lightning's
	// registrations): the route must not read other services for its
	// caller.
	EngineAnswersOnly bool
}

// ProxyAgent serves ctx, a POST with an OpenAI body, as the model call ac
// describes. The client's key is not checked (the mounting route has its
// own authentication).
func (s *Server) ProxyAgent(ctx *fasthttp.RequestCtx, ac AgentCall) {
	var once sync.Once
	end := func() {
		if ac.Done != nil {
			once.Do(ac.Done)
		}
	}
	attr := attribution{rolloutID: []byte(ac.RolloutID), attemptID: []byte(ac.AttemptID), fromPath: true}
	attr.taskID = ctx.Request.Header.Peek("x-task-id")
	attr.agentName = ctx.Request.Header.Peek("x-agent-name")
	path := []byte("/v1/completions")
	if ac.Endpoint == openai.ChatCompletions {
		path = []byte("/v1/chat/completions")
	}
	s.proxyWith(ctx, attr, ac.Endpoint, path, callOptions{force: ac.Force, detail: ac.DetailErrors, onEnd: end, noKeyCheck: true,
		retries: ac.Retries, backoff: ac.RetryBackoff, retryStatus: ac.RetryStatuses, pool: ac.Pool, engineOnly: ac.EngineAnswersOnly})
	// A stream ends once written (streamBody.CloseWithError calls finish,
	// which calls onEnd): on the hijacked connection (streamconn.go) or, when
	// translated, when fasthttp closes its body. Anything else has ended.
	if !ctx.Response.IsBodyStream() && !ctx.Hijacked() {
		end()
	}
}

// callOptions are what a mounted route changes about a proxied call.
type callOptions struct {
	force       *rewrite.ForceSet
	detail      bool
	onEnd       func()
	noKeyCheck  bool
	retries     int            // > 0: replaces Config.Retries
	backoff     time.Duration  // > 0: replaces Config.RetryBackoff
	retryStatus bool           // retry 408, 409, 429 and 5xx answers too
	pool        *backends.Pool // the pool serving the call; nil = by model
	engineOnly  bool           // AgentCall.EngineAnswersOnly
	// endpoint, when set, is the route the client called where it differs
	// from the engine's (the endpoint column): /v1/messages over chat.
	endpoint openai.Endpoint
	// wrapStream, when set, wraps an event stream's body on its way to the
	// client (messagesStream); the wrapper passes CloseWithError on.
	wrapStream func(io.Reader) io.Reader
}

// maxRetryBackoff bounds the doubling wait between attempts.
const maxRetryBackoff = 8 * time.Second

// retryableStatus is Agent Lightning's set of statuses worth another attempt.
func retryableStatus(code int) bool {
	return code == 408 || code == 409 || code == 429 || code >= 500
}

// appendDetail appends a FastAPI-style error body: {"detail": msg}.
func appendDetail(dst []byte, msg string) []byte {
	dst = append(dst, `{"detail":`...)
	dst = strconv.AppendQuote(dst, msg)
	return append(dst, '}')
}

// errorBody is the error body of a call: OpenAI-style, or FastAPI-style
// for a mounted route that asked for it.
func errorBody(dst []byte, c *call, status int, typ, msg string) []byte {
	if c != nil && c.opts.detail {
		return appendDetail(dst, msg)
	}
	return appendError(dst, status, typ, msg)
}

// withhold answers a call whose backend answered something that is not an
// inference engine's answer (AgentCall.EngineAnswersOnly): 502 naming the
// status and the content type, never the body or the headers, captured as
// an error. why, when set, says what is wrong with the body. It releases
// resp, the replica and the call's slot.
func (s *Server) withhold(ctx *fasthttp.RequestCtx, c *call, r *backends.Upstream, resp *fasthttp.Response, why string) {
	status := resp.StatusCode()
	ctype := mediaType(resp.Header.ContentType())
	abortResponse(resp, errWithheld)
	s.release(r)
	s.releaseSlot()
	if why == "" {
		why = "Content-Type " + ctype
	}
	s.log.Warn("a mounted route's backend answered something that is not an inference engine's answer; its body is not passed on",
		"backend", r.Name(), "status", status, "content_type", ctype, "why", why)
	s.fail(ctx, c, fasthttp.StatusBadGateway, errUpstream, fmt.Sprintf(
		"backend %s answered HTTP %d (%s), not an OpenAI-compatible answer (a JSON object, or a 2xx text/event-stream); its body is not passed on",
		r.Name(), status, why))
}

// errWithheld closes an upstream answer that withhold does not pass on.
var errWithheld = errors.New("answer withheld: not an inference engine's answer")

// jsonContentType reports whether a Content-Type is JSON (application/json
// or a +json type).
func jsonContentType(ct []byte) bool {
	mt := mediaType(ct)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// mediaType is a Content-Type's media type, lower-cased, when it is a
// plain type/subtype of at most 64 characters; else "unusual" (the value is
// the other end's, shown in errors).
func mediaType(ct []byte) string {
	mt, _, _ := strings.Cut(string(ct), ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	if mt == "" {
		return "none"
	}
	if len(mt) > 64 || strings.Count(mt, "/") != 1 {
		return "unusual"
	}
	for _, c := range mt {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.ContainsRune("/.+-_", c)) {
			return "unusual"
		}
	}
	return mt
}

// jsonObject reports whether b is one JSON object (spaces around it
// allowed), nested at most jsonscan.MaxDepth deep (gjson.Valid recurses
// without a bound: an upstream's deep answer must not reach it).
func jsonObject(b []byte) bool {
	t := bytes.TrimSpace(b)
	return len(t) > 0 && t[0] == '{' && jsonscan.Validate(t) == nil
}
