package mock

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// vLLM 0.32's own pause routes (vllm/entrypoints/rl/online/api_router.py),
// served, as vLLM serves them, only in dev mode (VLLM_SERVER_DEV_MODE=1;
// here Config.DevMode, flag --dev-mode) by the vLLM flavour:
//
//   - POST /pause?mode=abort|wait|keep (default abort; another mode is 422;
//     answer {"status":"paused"}): abort ends every streamed generate
//     under way as an abort does (abort.go: finish_reason "abort"); wait
//     answers once the requests under way finished; keep freezes them
//     between two tokens until /resume. In every mode requests that arrive
//     while paused wait for /resume before their first token (the engine
//     does not schedule them).
//   - POST /resume: {"status":"resumed"}.
//   - GET /is_paused: {"is_paused": bool}.
//
// Deviation: abort ends only streamed generate requests (the token-in path
// the gateway resumes); other requests under way finish.
const (
	PathPause    = "/pause"
	PathResume   = "/resume"
	PathIsPaused = "/is_paused"
)

// enginePause is the mock engine's pause state.
type enginePause struct {
	mu      sync.Mutex
	paused  bool
	keep    bool          // mode keep: requests under way freeze too
	resumed chan struct{} // closed by resume
	frozen  atomic.Int64  // requests under way waiting in mode keep
}

// Frozen returns how many requests under way wait between two tokens for
// /resume (vLLM's /pause?mode=keep).
func (s *Server) Frozen() int64 { return s.enginePause.frozen.Load() }

// wait blocks while the engine is paused (inFlight: the caller is a
// request under way, which only mode keep freezes) or until abort or the
// server's shutdown closes their channel.
func (e *enginePause) wait(inFlight bool, abort, done <-chan struct{}) {
	e.mu.Lock()
	if !e.paused || (inFlight && !e.keep) {
		e.mu.Unlock()
		return
	}
	ch := e.resumed
	e.mu.Unlock()
	if inFlight {
		e.frozen.Add(1)
		defer e.frozen.Add(-1)
	}
	select {
	case <-ch:
	case <-abort:
	case <-done:
	}
}

// servePause serves PathPause, PathResume and PathIsPaused.
func (s *Server) servePause(ctx *fasthttp.RequestCtx, path string) {
	if s.cfg.Flavor != FlavorVLLM || !s.cfg.DevMode {
		s.writeError(ctx, fasthttp.StatusNotFound, "Not Found")
		return
	}
	e := &s.enginePause
	switch path {
	case PathIsPaused:
		if s.method(ctx, fasthttp.MethodGet) {
			e.mu.Lock()
			p := e.paused
			e.mu.Unlock()
			body := []byte(`{"is_paused":false}`)
			if p {
				body = []byte(`{"is_paused":true}`)
			}
			writeJSON(ctx, body)
		}
		return
	case PathResume:
		if s.method(ctx, fasthttp.MethodPost) {
			e.mu.Lock()
			if e.paused {
				e.paused, e.keep = false, false
				close(e.resumed)
			}
			e.mu.Unlock()
			writeJSON(ctx, []byte(`{"status":"resumed"}`))
		}
		return
	}
	if !s.method(ctx, fasthttp.MethodPost) {
		return
	}
	mode := string(ctx.QueryArgs().Peek("mode"))
	if mode == "" {
		mode = "abort"
	}
	if mode != "abort" && mode != "wait" && mode != "keep" {
		ctx.SetStatusCode(fasthttp.StatusUnprocessableEntity)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"detail":[{"type":"literal_error","loc":["query","mode"],"msg":"Input should be 'abort', 'wait' or 'keep'","input":` + string(appendJSONString(nil, mode)) + `}]}`)
		return
	}
	e.mu.Lock()
	if !e.paused {
		e.paused, e.resumed = true, make(chan struct{})
	}
	e.keep = mode == "keep"
	e.mu.Unlock()
	switch mode {
	case "abort":
		s.aborts.abortAll()
	case "wait":
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for s.streams.Load() > 0 || s.generating.Load() > 0 {
			select {
			case <-t.C:
			case <-s.done:
				return
			}
		}
	}
	writeJSON(ctx, []byte(`{"status":"paused"}`))
}
