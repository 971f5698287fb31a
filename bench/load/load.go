// Package load is rollgate's load generator: closed-loop agents that run
// multi-turn rollouts (some turns calling a tool) against an OpenAI-compatible
// base URL, or an open-loop stream of calls at a fixed rate, streaming or not.
// It measures throughput, latency and time to first token from exact samples,
// and afterwards checks that every call it saw was captured exactly once
// (Verify).
package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Modes of Config.Mode.
const (
	ModeClosed = "closed" // agents send their next call as soon as the last one ends
	ModeOpen   = "open"   // calls start at a fixed rate whatever the answers take
)

// Path styles of Config.PathStyle.
const (
	// PathRollout sends each call to BASE/rollout/{rollout}/attempt/{attempt}/v1/chat/completions,
	// rollgate's per-rollout base URL.
	PathRollout = "rollout"
	// PathPlain sends every call to BASE/v1/chat/completions (engines, plain proxies).
	PathPlain = "plain"
)

// Config describes one load run. Zero values take the defaults of SetDefaults.
type Config struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8000 (no /v1).
	BaseURL string
	// PathStyle is PathRollout or PathPlain. Default PathRollout.
	PathStyle string
	// Mode is ModeClosed or ModeOpen. Default ModeClosed.
	Mode string
	// Agents is the number of concurrent closed-loop agents. Default 4.
	Agents int
	// Turns is the number of calls in one rollout. Default 3.
	Turns int
	// Rollouts caps the number of rollouts of a closed-loop run (0 = until Duration).
	Rollouts int
	// Duration bounds the run (0 = until Rollouts, or Requests in open mode).
	// When neither Duration nor a count is set, Rollouts defaults to Agents.
	Duration time.Duration
	// Rate is the open-loop rate in calls per second. Default 100.
	Rate float64
	// Requests caps the number of open-loop calls (0 = until Duration).
	Requests int
	// OpenTurns is how many consecutive open-loop calls share a rollout (as
	// its turns 1..OpenTurns, each call's own message). Default 1: every call
	// starts a rollout, so every call is an attempt's first and reserves the
	// attempt's sequence ids, as in single-turn RL (one answer per task).
	OpenTurns int
	// MaxInFlight bounds open-loop calls in flight; a call that would exceed
	// it is counted as an error ("overload") instead of sent. Default 4096.
	MaxInFlight int
	// Stream makes every call a streaming call.
	Stream bool
	// IncludeUsage asks for the usage chunk of streams (stream_options.include_usage).
	IncludeUsage bool
	// ReturnTokenIDs asks the engine for token ids (vLLM's return_token_ids),
	// as rollgate does for every call it forwards: direct runs with it (and
	// IncludeUsage on streams) make the engine do the same work as behind
	// rollgate, so that the engine's share of rollgate's cost can be told apart.
	ReturnTokenIDs bool
	// Logprobs asks for the sampled tokens' logprobs ("logprobs": true, no
	// top_logprobs), as rollgate does by default (--inject-logprobs).
	Logprobs bool
	// ToolEvery > 0 offers a tool on turns 0, k, 2k, ... of each rollout; the
	// engine answers with a tool call and the next turn sends the tool result.
	ToolEvery int
	// SystemBytes > 0 pads each rollout's system message to about that many
	// bytes of text (a long instruction or retrieved context), so that the
	// cost of request size can be measured: agents' requests grow to
	// hundreds of KB as their contexts do.
	SystemBytes int
	// ContextBytes > 0 adds about that many bytes of text of the rollout's
	// own to its first user message (a task description, a retrieved
	// document, an observation), resent with the rest of the conversation
	// every turn: what an engine's prefix cache can keep for the rollout's
	// later turns, unlike the system message shared by every rollout.
	ContextBytes int
	// ThinkTime is how long a closed-loop agent waits after an answer before
	// its next turn: the environment's step (running a tool, a test suite, a
	// browser), during which other agents' calls arrive. Default 0.
	ThinkTime time.Duration
	// MaxTokens is the request's max_tokens (0 = leave it out).
	MaxTokens int
	// Model is the request's model. Default "mock-model".
	Model string
	// Header holds extra request headers (e.g. a peer gateway's routing headers).
	Header http.Header
	// RunID prefixes every rollout id, so that runs sharing a store can be
	// told apart. Default: a random id.
	RunID string
	// Timeout bounds one call. Default 60s.
	Timeout time.Duration
	// Client sends the calls. Default: a keep-alive client sized for the load.
	Client *http.Client
}

// SetDefaults fills zero fields with their defaults.
func (c *Config) SetDefaults() {
	if c.PathStyle == "" {
		c.PathStyle = PathRollout
	}
	if c.Mode == "" {
		c.Mode = ModeClosed
	}
	if c.Agents <= 0 {
		c.Agents = 4
	}
	if c.Turns <= 0 {
		c.Turns = 3
	}
	if c.Rate <= 0 {
		c.Rate = 100
	}
	if c.OpenTurns <= 0 {
		c.OpenTurns = 1
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 4096
	}
	if c.Model == "" {
		c.Model = "mock-model"
	}
	if c.RunID == "" {
		c.RunID = fmt.Sprintf("bench-%x", rand.Uint64()&0xffffffffff)
	}
	if c.Timeout <= 0 {
		c.Timeout = 60 * time.Second
	}
	if c.Duration <= 0 && c.Rollouts <= 0 && c.Requests <= 0 {
		if c.Mode == ModeOpen {
			c.Requests = int(c.Rate)
		} else {
			c.Rollouts = c.Agents
		}
	}
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
}

func (c *Config) validate() error {
	switch {
	case c.BaseURL == "":
		return errors.New("load: no base URL")
	case c.PathStyle != PathRollout && c.PathStyle != PathPlain:
		return fmt.Errorf("load: path style %q: want %q or %q", c.PathStyle, PathRollout, PathPlain)
	case c.Mode != ModeClosed && c.Mode != ModeOpen:
		return fmt.Errorf("load: mode %q: want %q or %q", c.Mode, ModeClosed, ModeOpen)
	}
	return nil
}

// Call is what the client saw of one call.
type Call struct {
	RolloutID  string
	AttemptID  string
	Turn       int
	Stream     bool
	Start      time.Time
	Latency    time.Duration // send to end of body; in open mode from the scheduled start
	TTFT       time.Duration // streams: to the first event carrying a token; 0 otherwise
	Status     int
	Err        string // transport or protocol error; "" when the call succeeded
	RequestID  string // x-request-id response header
	SequenceID string // x-sequence-id response header
	// CompletionTokens is usage.completion_tokens as the client saw it, -1 when absent.
	CompletionTokens int
	ToolCall         bool // the answer was a tool call
}

// OK reports whether the call succeeded (HTTP 200 and a complete body).
func (c *Call) OK() bool { return c.Status == http.StatusOK && c.Err == "" }

// Run runs the load described by cfg and returns every call it made.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.SetDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		cfg.Client = NewClient(cfg.Agents + cfg.MaxInFlight)
		defer cfg.Client.CloseIdleConnections()
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	r := &Result{Config: cfg}
	start := time.Now()
	if cfg.Mode == ModeOpen {
		r.Calls = runOpen(ctx, &cfg)
	} else {
		r.Calls = runClosed(ctx, &cfg)
	}
	r.Elapsed = time.Since(start)
	return r, nil
}

// Result is a finished run: its configuration, wall time and calls.
type Result struct {
	Config  Config
	Elapsed time.Duration
	Calls   []Call
}

// NewClient returns an HTTP client that keeps up to conns connections alive
// per host and never compresses.
func NewClient(conns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

func runClosed(ctx context.Context, cfg *Config) []Call {
	var (
		next  atomic.Int64 // rollouts started
		mu    sync.Mutex
		calls []Call
		wg    sync.WaitGroup
	)
	for a := 0; a < cfg.Agents; a++ {
		wg.Add(1)
		go func(agent int) {
			defer wg.Done()
			ag := newAgent(cfg)
			var mine []Call
			for ctx.Err() == nil {
				n := next.Add(1)
				if cfg.Rollouts > 0 && n > int64(cfg.Rollouts) {
					break
				}
				mine = ag.rollout(ctx, fmt.Sprintf("%s-r%d", cfg.RunID, n), mine)
			}
			mu.Lock()
			calls = append(calls, mine...)
			mu.Unlock()
		}(a)
	}
	wg.Wait()
	return calls
}

func runOpen(ctx context.Context, cfg *Config) []Call {
	var (
		mu       sync.Mutex
		calls    []Call
		wg       sync.WaitGroup
		inFlight atomic.Int64
	)
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	start := time.Now()
	for i := 0; cfg.Requests <= 0 || i < cfg.Requests; i++ {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		rollout := fmt.Sprintf("%s-o%d", cfg.RunID, i/cfg.OpenTurns+1)
		if inFlight.Add(1) > int64(cfg.MaxInFlight) {
			inFlight.Add(-1)
			mu.Lock()
			calls = append(calls, Call{RolloutID: rollout, AttemptID: "1", Stream: cfg.Stream, Start: at, Err: "overload: too many calls in flight", CompletionTokens: -1})
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inFlight.Add(-1)
			ag := newAgent(cfg)
			// Calls in flight finish even after the run's time is up.
			c := ag.call(context.WithoutCancel(ctx), rollout, i, at)
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return calls
}
