// Package mock is a faithful, deterministic and fast stand-in for a vLLM (>= 0.10.2)
// OpenAI-compatible server, built on fasthttp. It is the only backend allowed in tests and
// the baseline of benchmarks; it follows the engines' wire shapes
// described in docs/engines.md byte for byte.
//
// Config.Flavor (flag -flavor) makes it imitate another engine instead, each following
// docs/engines.md (see Flavor and sglang.go, llamacpp.go for the exact shapes):
//
//	vllm      the default, as above
//	sglang    ids per choice (choices[].prompt_token_ids, choices[].token_ids) on chat and
//	          completions, streamed too, except streamed chat with return_token_ids: 400;
//	          flat errors {"object":"error",...}; no /version; owned_by "sglang"
//	llamacpp  no token ids at all; chat logprobs entries carry the token "id"; /tokenize
//	          {"content"}, /detokenize, /apply-template, GET /props; owned_by "llamacpp"
//
// Everything it says is a pure function of the request content and Config: the same
// request gives the same bytes. Generated text depends on the model, the rendered prompt
// (messages + tools, or the completion prompt), seed, temperature and the choice index;
// ids ("chatcmpl-<hex>") additionally on n, max_tokens and the output length. Neither
// depends on return_token_ids, stream, stream_options or logprobs, so a request with
// injected fields answers with the same text as the plain one.
//
// Per-request knobs, as request headers:
//
//	x-mock-ttft-ms: N     delay before the first token
//	x-mock-itl-ms: N      delay between tokens
//	x-mock-tokens: N      natural output length (finish "stop" after N tokens)
//	x-mock-fail: status=NNN   answer HTTP NNN with a vLLM error body, before anything else
//	x-mock-fail: midstream    streams: after a few tokens send data: {"error":...} and end
//	                          without [DONE]; non-streaming requests get HTTP 500
//	x-mock-fail: hang         send nothing; close when the client leaves or after HangTimeout
//	x-mock-fail: disconnect   close the TCP connection without a response
//	x-mock-fail: badjson      chat/completions streams: after a few tokens one event whose JSON is
//	                          cut short, then the stream goes on; non-streaming: a cut JSON body
//	x-mock-fail: junk         streams: after a few tokens a line that is not SSE, then the stream
//	                          goes on; non-streaming: a body that is not JSON
//	x-mock-fail: truncate     streams: after a few tokens the stream ends cleanly with no finish
//	                          chunk, no usage and no [DONE]; non-streaming: a cut JSON body
//	x-mock-first-try-only: 1  apply the x-mock-* headers above only to a first try: a request
//	                          whose x-stainless-retry-count (the OpenAI and Anthropic SDKs'
//	                          retry header) is above 0 is served as if they were absent, so
//	                          an SDK's retry of a delayed or failed call is answered
package mock

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Routes served by the mock.
const (
	PathChat             = "/v1/chat/completions"
	PathCompletions      = "/v1/completions"
	PathResponses        = "/v1/responses"
	PathEmbeddings       = "/v1/embeddings"
	PathModels           = "/v1/models"
	PathVersion          = "/version"
	PathHealth           = "/health"
	PathTokenize         = "/tokenize"
	PathDetokenize       = "/detokenize"
	PathSleep            = "/sleep"
	PathWakeUp           = "/wake_up"
	PathIsSleeping       = "/is_sleeping"
	PathResetPrefixCache = "/reset_prefix_cache"
	// PathMetrics serves the prefix-cache counters (see prefixcache.go).
	PathMetrics = "/metrics"
	// PathApplyTemplate and PathProps are served by FlavorLlamaCpp only.
	PathApplyTemplate = "/apply-template"
	PathProps         = "/props"
)

var knownPaths = []string{PathChat, PathCompletions, PathResponses, PathEmbeddings, PathModels,
	PathVersion, PathHealth, PathTokenize, PathDetokenize, PathSleep, PathWakeUp, PathIsSleeping,
	PathResetPrefixCache, PathApplyTemplate, PathProps, PathMetrics, PathRender, PathGenerate, PathDerender, PathAbortRequests, PathPause, PathResume, PathIsPaused}

// Server is a mock vLLM server. Create it with New or Start.
type Server struct {
	cfg  Config
	v    *vocabulary // the toy tokenizer and template, or Config.ModelDir's
	srv  *fasthttp.Server
	done chan struct{}
	once sync.Once

	requests   atomic.Int64
	streams    atomic.Int64
	generating atomic.Int64
	aborted    atomic.Int64
	perPath    map[string]*atomic.Int64
	sleeping   atomic.Bool

	mu       sync.Mutex
	lastBody []byte
	lastPath string
	lastHdr  fasthttp.RequestHeader
	genHdr   fasthttp.RequestHeader // the last /inference/v1/generate request's
	hijacked map[net.Conn]struct{}

	modelsBody  []byte
	versionBody []byte
	propsBody   []byte

	pc *prefixCache // nil unless Config.PrefixCacheBlocks > 0

	aborts      abortable   // streamed generate requests PathAbortRequests can abort
	enginePause enginePause // vLLM's /pause state (enginepause.go)
}

// New returns a server for cfg (zero fields take their defaults). It panics when
// cfg.Flavor is not one of Flavors; Start returns an error instead.
func New(cfg Config) *Server {
	s, err := NewChecked(cfg)
	if err != nil {
		panic(err.Error())
	}
	return s
}

// NewChecked is New returning an invalid configuration (an unknown
// flavour, a ModelDir that does not load or with another flavour or
// SplitChars) as an error.
func NewChecked(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if _, err := ParseFlavor(string(cfg.Flavor)); err != nil {
		return nil, err
	}
	v := toy
	if cfg.ModelDir != "" {
		if cfg.Flavor != FlavorVLLM || cfg.SplitChars > 0 {
			return nil, errors.New("mock: --model-dir needs --flavor vllm and no --split-chars (real-template mode imitates vLLM only)")
		}
		var err error
		if v, err = loadVocabulary(cfg.ModelDir); err != nil {
			return nil, err
		}
		cfg.EndOfTurn = true // a real model ends its turn with the end-of-turn token
	}
	s := &Server{
		v:        v,
		cfg:      cfg,
		done:     make(chan struct{}),
		perPath:  make(map[string]*atomic.Int64, len(knownPaths)),
		hijacked: make(map[net.Conn]struct{}),
	}
	for _, p := range knownPaths {
		s.perPath[p] = new(atomic.Int64)
	}
	if cfg.PrefixCacheBlocks > 0 {
		s.pc = newPrefixCache(cfg.PrefixCacheBlocks)
	}
	s.modelsBody = s.appendFlavorModels(nil)
	if cfg.Flavor == FlavorLlamaCpp {
		s.propsBody = s.appendProps(nil)
	}
	s.versionBody = append(appendJSONString([]byte(`{"version":`), cfg.Version), '}')
	s.srv = &fasthttp.Server{
		Handler:            s.handle,
		Name:               "uvicorn",
		MaxRequestBodySize: 64 << 20,
		CloseOnShutdown:    true,
	}
	return s, nil
}

// Config returns the effective configuration (defaults applied).
func (s *Server) Config() Config { return s.cfg }

// Handler returns the request handler, for use with any fasthttp server or in-memory tests.
func (s *Server) Handler() fasthttp.RequestHandler { return s.handle }

// Serve serves HTTP on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); err != nil {
		return fmt.Errorf("mock vLLM: serve on %s: %w", ln.Addr(), err)
	}
	return nil
}

// Shutdown stops the server: pending delays end, streams stop, held connections close.
func (s *Server) Shutdown() error {
	s.once.Do(func() { close(s.done) })
	s.mu.Lock()
	for c := range s.hijacked {
		// fasthttp's hijacked conn ignores Close (it closes the conn itself once the
		// hijack handler returns), so wake the handler's Read instead.
		_ = c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	if err := s.srv.Shutdown(); err != nil {
		return fmt.Errorf("mock vLLM: shutdown: %w", err)
	}
	return nil
}

// Start listens on 127.0.0.1 on a free port, serves in a goroutine and returns the server
// and its OpenAI base URL, e.g. "http://127.0.0.1:41234/v1". Stop it with Shutdown.
func Start(cfg Config) (s *Server, baseURL string, err error) {
	if s, err = NewChecked(cfg); err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("mock vLLM: listen on 127.0.0.1:0: %w", err)
	}
	go s.Serve(ln) //nolint:errcheck // Serve returns nil after Shutdown
	return s, "http://" + ln.Addr().String() + "/v1", nil
}

// Requests returns how many HTTP requests the server received (all routes).
func (s *Server) Requests() int64 { return s.requests.Load() }

// ActiveStreams returns how many SSE responses are being written right now. It drops when a
// stream ends, including when the client goes away mid-stream, so tests can check that a
// proxy cancels its upstream request.
func (s *Server) ActiveStreams() int64 { return s.streams.Load() }

// Generating returns how many non-streaming requests are generating right now (waiting out
// their TTFT and ITL delays), so tests can tell that a request has arrived.
func (s *Server) Generating() int64 { return s.generating.Load() }

// Aborted returns how many non-streaming requests were aborted because their client
// closed the connection while they were generating: vLLM aborts such a request (its API
// server cancels it on disconnect) and sends nothing. Streams end when a write fails (see
// ActiveStreams). Only counted where the platform can peek at a socket (unix).
func (s *Server) Aborted() int64 { return s.aborted.Load() }

// RequestsTo returns how many requests reached path (one of the Path* constants).
func (s *Server) RequestsTo(path string) int64 {
	if c := s.perPath[path]; c != nil {
		return c.Load()
	}
	return 0
}

// LastRequest returns a copy of the body of the last request received.
func (s *Server) LastRequest() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.lastBody...)
}

// LastPath returns the path of the last request received.
func (s *Server) LastPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastPath
}

// LastHeader returns the value of header name in the last request received.
func (s *Server) LastHeader(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.lastHdr.Peek(name))
}

// LastGenerateHeader returns the value of header name in the last
// /inference/v1/generate request received (health checks and other routes
// in between do not replace it).
func (s *Server) LastGenerateHeader(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.genHdr.Peek(name))
}

func (s *Server) record(ctx *fasthttp.RequestCtx) {
	s.requests.Add(1)
	path := ctx.Path()
	if c := s.perPath[b2s(path)]; c != nil {
		c.Add(1)
	}
	s.mu.Lock()
	s.lastBody = append(s.lastBody[:0], ctx.PostBody()...)
	if s.lastPath != b2s(path) {
		s.lastPath = string(path)
	}
	ctx.Request.Header.CopyTo(&s.lastHdr)
	s.mu.Unlock()
}

// knobs are the per-request header overrides.
type knobs struct {
	ttft, itl time.Duration
	tokens    int
	midstream bool
	broken    string // badjson, junk or truncate (x-mock-fail)
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	s.record(ctx)
	k, ok := s.readKnobs(ctx)
	if !ok {
		return
	}
	path := b2s(ctx.Path())
	if !s.routed(path) {
		s.writeError(ctx, fasthttp.StatusNotFound, "Not Found")
		return
	}
	s.serveRoute(ctx, path, &k)
}

// readKnobs reads the per-request header overrides (x-mock-fail,
// x-mock-ttft-ms, x-mock-itl-ms, x-mock-tokens) over the configured values.
// ok false: the request was answered (a bad header, or a failure
// x-mock-fail asked for).
func (s *Server) readKnobs(ctx *fasthttp.RequestCtx) (k knobs, ok bool) {
	k = knobs{ttft: s.cfg.TTFT, itl: s.cfg.ITL, tokens: s.cfg.MaxTokens}
	h := &ctx.Request.Header
	if len(h.Peek("x-mock-first-try-only")) > 0 {
		if n, err := fasthttp.ParseUint(h.Peek("x-stainless-retry-count")); err == nil && n > 0 {
			return k, true
		}
	}
	if v := h.Peek("x-mock-fail"); len(v) > 0 {
		if !s.fail(ctx, b2s(v), &k) {
			return k, false
		}
	}
	const millis = "a non-negative integer of milliseconds"
	if ms, set, ok := s.headerInt(ctx, "x-mock-ttft-ms", 0, millis); !ok {
		return k, false
	} else if set {
		k.ttft = time.Duration(ms) * time.Millisecond
	}
	if ms, set, ok := s.headerInt(ctx, "x-mock-itl-ms", 0, millis); !ok {
		return k, false
	} else if set {
		k.itl = time.Duration(ms) * time.Millisecond
	}
	if n, set, ok := s.headerInt(ctx, "x-mock-tokens", 1, "a positive integer"); !ok {
		return k, false
	} else if set {
		k.tokens = min(n, s.cfg.MaxModelLen)
	}
	return k, true
}

// headerInt reads header name as an integer of at least lo (set: the
// header is there). ok false: it is not, and the request was answered 400
// saying it wants what.
func (s *Server) headerInt(ctx *fasthttp.RequestCtx, name string, lo int, what string) (n int, set, ok bool) {
	v := ctx.Request.Header.Peek(name)
	if len(v) == 0 {
		return 0, false, true
	}
	n, err := strconv.Atoi(b2s(v))
	if err != nil || n < lo {
		s.writeError(ctx, 400, name+": want "+what+", got "+strconv.Quote(string(v)))
		return 0, false, false
	}
	return n, true, true
}

// serveRoute answers a routed path.
func (s *Server) serveRoute(ctx *fasthttp.RequestCtx, path string, k *knobs) {
	switch path {
	case PathChat:
		if s.method(ctx, fasthttp.MethodPost) {
			s.chat(ctx, k)
		}
	case PathCompletions:
		if s.method(ctx, fasthttp.MethodPost) {
			s.completions(ctx, k)
		}
	case PathResponses:
		if s.method(ctx, fasthttp.MethodPost) {
			s.responses(ctx, k)
		}
	case PathEmbeddings:
		if s.method(ctx, fasthttp.MethodPost) {
			s.embeddings(ctx)
		}
	case PathModels:
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, s.modelsBody)
		}
	case PathVersion:
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, s.versionBody)
		}
	case PathHealth:
		if s.method(ctx, fasthttp.MethodGet) {
			s.writeHealth(ctx)
		}
	case PathTokenize:
		if s.method(ctx, fasthttp.MethodPost) {
			s.tokenize(ctx)
		}
	case PathDetokenize:
		if s.method(ctx, fasthttp.MethodPost) {
			s.detokenize(ctx)
		}
	case PathSleep:
		if s.method(ctx, fasthttp.MethodPost) {
			s.sleeping.Store(true)
		}
	case PathWakeUp:
		if s.method(ctx, fasthttp.MethodPost) {
			s.sleeping.Store(false)
		}
	case PathApplyTemplate:
		if s.method(ctx, fasthttp.MethodPost) {
			s.applyTemplate(ctx)
		}
	case PathProps:
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, s.propsBody)
		}
	case PathResetPrefixCache:
		if s.method(ctx, fasthttp.MethodPost) {
			s.resetPrefixCache()
		}
	case PathMetrics:
		if s.method(ctx, fasthttp.MethodGet) {
			s.writeMetrics(ctx)
		}
	case PathRender, PathGenerate, PathDerender, PathAbortRequests:
		s.scaleOut(ctx, path, k)
	case PathPause, PathResume, PathIsPaused:
		s.servePause(ctx, path)
	case PathIsSleeping:
		if s.method(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, strconv.AppendBool([]byte(`{"is_sleeping":`), s.sleeping.Load()))
			ctx.Response.AppendBodyString("}")
		}
	default:
		s.writeError(ctx, fasthttp.StatusNotFound, "Not Found")
	}
}

// method answers 405 and returns false unless the request uses method m.
func (s *Server) method(ctx *fasthttp.RequestCtx, m string) bool {
	if b2s(ctx.Method()) == m {
		return true
	}
	s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
	return false
}

// fail applies x-mock-fail; it returns true when the request should go on.
func (s *Server) fail(ctx *fasthttp.RequestCtx, v string, k *knobs) bool {
	switch {
	case strings.HasPrefix(v, "status="):
		code, err := strconv.Atoi(v[len("status="):])
		if err != nil || code < 100 || code > 599 {
			s.writeError(ctx, 400, "x-mock-fail: want status=NNN with 100 <= NNN <= 599, got "+strconv.Quote(v))
			return false
		}
		s.writeError(ctx, code, "mock failure: status "+strconv.Itoa(code)+" requested by x-mock-fail")
		return false
	case v == "midstream":
		k.midstream = true
		return true
	case v == "badjson" || v == "junk" || v == "truncate":
		k.broken = v
		return true
	case v == "hang":
		wait := s.cfg.HangTimeout
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { s.hang(c, wait) })
		return false
	case v == "disconnect":
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(net.Conn) {}) // fasthttp closes the connection after this returns
		return false
	}
	s.writeError(ctx, 400, "x-mock-fail: want status=NNN, midstream, badjson, junk, truncate, hang or disconnect, got "+strconv.Quote(v))
	return false
}

// hang holds c, reading and discarding, until the peer closes it, wait passes or Shutdown.
func (s *Server) hang(c net.Conn, wait time.Duration) {
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		return
	default:
	}
	s.hijacked[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.hijacked, c)
		s.mu.Unlock()
	}()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var buf [512]byte
	for {
		if _, err := c.Read(buf[:]); err != nil {
			return
		}
	}
}

// errorType maps a status to vLLM's error type name, e.g. 400 -> "BadRequestError".
func errorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 404:
		return "NotFoundError"
	case 500:
		return "InternalServerError"
	}
	msg := fasthttp.StatusMessage(status)
	if msg == "Unknown Status Code" {
		return "Error"
	}
	return strings.ReplaceAll(msg, " ", "") + "Error"
}

// appendError appends vLLM's error body.
func appendError(dst []byte, status int, msg string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, errorType(status))
	dst = append(dst, `,"param":null,"code":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	return append(dst, "}}"...)
}

// writeError answers status with the error body of the server's flavour.
func (s *Server) writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	var body []byte
	switch s.cfg.Flavor {
	case FlavorSGLang:
		body = appendSGLangError(nil, status, msg)
	case FlavorLlamaCpp:
		body = appendLlamaCppError(nil, status, msg)
	default:
		body = appendError(nil, status, msg)
	}
	ctx.Response.SetBodyRaw(body)
}

func writeJSON(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// errShutdown is returned by waits interrupted by Shutdown.
var errShutdown = errors.New("mock vLLM: shutting down")

// wait sleeps d unless the server shuts down first (then it returns errShutdown).
func (s *Server) wait(t **time.Timer, d time.Duration) error {
	return s.waitOrLeave(t, d, nil)
}

// waitOrLeave is wait that also ends, with errClientLeft, when left is closed.
func (s *Server) waitOrLeave(t **time.Timer, d time.Duration, left <-chan struct{}) error {
	return s.waitOrAbort(t, d, left, nil) // a nil channel never closes
}

// sse writes one SSE data event and flushes it; an error means the client went away.
func sse(w *bufio.Writer, payload []byte) error {
	if _, err := w.WriteString("data: "); err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	if _, err := w.WriteString("\n\n"); err != nil {
		return err
	}
	return w.Flush()
}

func (s *Server) appendModels(dst []byte) []byte {
	dst = append(dst, `{"object":"list","data":[`...)
	for i, m := range append([]string{s.cfg.Model}, s.cfg.ExtraModels...) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = appendJSONString(dst, m)
		dst = append(dst, `,"object":"model","created":`...)
		dst = strconv.AppendInt(dst, s.cfg.Created, 10)
		dst = append(dst, `,"owned_by":"vllm","root":`...)
		dst = appendJSONString(dst, m)
		dst = append(dst, `,"parent":null,"max_model_len":`...)
		dst = strconv.AppendInt(dst, int64(s.cfg.MaxModelLen), 10)
		dst = append(dst, `,"permission":[{"id":"modelperm-`...)
		h := newHasher()
		h.str(m)
		dst = appendHex(dst, h.sum())
		dst = append(dst, `","object":"model_permission","created":`...)
		dst = strconv.AppendInt(dst, s.cfg.Created, 10)
		dst = append(dst, `,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}`...)
	}
	return append(dst, "]}"...)
}
