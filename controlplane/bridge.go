package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane/lease"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
)

// bridgeRequest is the body of POST /api/v1/bridge/batches: what rollout
// bridge's flags say, as JSON. Zero values take the bridge's defaults
// (latest succeeded or failed attempt, transitions, GRPO, AIR on, missing
// rewards 0, responses cut at max_response).
type bridgeRequest struct {
	// The bridge's options, as rollgate bridge's flags fill them.
	bridge.Request
	After *int64 `json:"after"` // completion cursor of the task queue
	// Tokenizer names one of Config.BridgeTokenizers to retokenize calls
	// captured without ids with (rollgate bridge --retokenize takes the
	// folder itself; a request never names a server path).
	Tokenizer string `json:"retokenize"`
}

// serveLease serves the trainer's pull API (controlplane/lease: POST
// lease, POST ack, GET counts) under /api/v1/bridge/; rest is the path below
// /api/v1/bridge/.
func (s *Server) serveLease(ctx *fasthttp.RequestCtx, rest []string) {
	s.leaseQueue().Serve(ctx, "/"+rest[0])
}

// leaseQueue returns the gateway's sample queue, made on first use.
func (s *Server) leaseQueue() *lease.Queue {
	s.leaseOnce.Do(func() {
		ttl := s.cfg.BridgeLeaseTTL
		if ttl <= 0 {
			ttl = DefaultBridgeLeaseTTL
		}
		s.leases = lease.New(ttl, nil)
	})
	return s.leases
}

func (s *Server) postBatches(ctx *fasthttp.RequestCtx) {
	var in bridgeRequest
	if !s.decode(ctx, &in) {
		return
	}
	o, err := in.Request.Options()
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	if in.Tokenizer != "" {
		rt, status, err := s.retokenizer(in.Tokenizer)
		if err != nil {
			typ := errInvalidRequest
			if status != fasthttp.StatusBadRequest {
				typ = errServer
			}
			s.plainError(ctx, status, typ, err.Error())
			return
		}
		o.Retokenize = rt
	}
	// Builds read the whole selection: allow more than the API's usual 30 s.
	c, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	next := int64(0)
	if in.After != nil {
		q := s.queue.Load()
		if q == nil {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, `"after" needs the task queue, which is not configured`)
			return
		}
		next = *in.After
		var ids []string
		for {
			page, n, err := q.List(c, tasks.ListFilter{After: next, Cursor: true, Limit: 10000})
			if err != nil {
				s.queueError(ctx, err)
				return
			}
			if len(page) == 0 {
				break
			}
			for _, st := range page {
				ids = append(ids, st.RolloutID)
			}
			next = n
		}
		if len(ids) == 0 {
			writeJSON(ctx, fasthttp.StatusOK, map[string]any{"samples": 0, "next_after": next})
			return
		}
		o.Selection.RolloutIDs = intersect(o.Selection.RolloutIDs, ids)
		if len(o.Selection.RolloutIDs) == 0 {
			writeJSON(ctx, fasthttp.StatusOK, map[string]any{"samples": 0, "next_after": next})
			return
		}
	}
	q := s.leaseQueue()
	var batch []json.RawMessage
	o.Emit = func(smp *bridge.Sample) error {
		b, err := json.Marshal(smp)
		if err != nil {
			return fmt.Errorf("encoding sample of %s: %w", smp.RolloutID, err)
		}
		batch = append(batch, b)
		return nil
	}
	res, err := bridge.Build(c, s.store, o)
	var oe *bridge.OptionError
	if errors.As(err, &oe) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, err.Error())
		return
	}
	q.Add(batch...)
	st := res.Stats
	out := map[string]any{
		"samples": st.Samples, "groups": st.Groups, "attempts": st.Attempts, "calls": st.Calls,
		"excluded": st.Excluded, "air_hits": st.AIRHits, "tasks": st.Tasks, "next_after": next,
		"retokenized": st.Retokenized, "retokenized_samples": st.RetokenizedSamples,
		"truncated": st.Truncated, "filled_rewards": st.FilledRewards, "small_groups": st.SmallGroups,
		"queue": q.Counts(),
	}
	if in.Report {
		out["report"] = res.Report
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// intersect keeps the ids of b that a holds (all of b when a is empty).
func intersect(a, b []string) []string {
	if len(a) == 0 {
		return b
	}
	keep := map[string]bool{}
	for _, id := range a {
		keep[id] = true
	}
	var out []string
	for _, id := range b {
		if keep[id] {
			out = append(out, id)
		}
	}
	return out
}

// retokenizer returns the retokenizer of the configured tokenizer name
// (Config.BridgeTokenizers), loading it on first use: 400 for a name that
// is not configured (listing those that are, never touching the file
// system), 503 when the configured folder does not load.
func (s *Server) retokenizer(name string) (*chattemplate.Retokenizer, int, error) {
	dir, ok := s.cfg.BridgeTokenizers[name]
	if !ok {
		names := slices.Sorted(maps.Keys(s.cfg.BridgeTokenizers))
		if len(names) == 0 {
			return nil, fasthttp.StatusBadRequest, fmt.Errorf(`"retokenize" %.80q: no tokenizers are configured; the operator names them with bridge_tokenizers (--bridge-tokenizers name=folder)`, name)
		}
		return nil, fasthttp.StatusBadRequest, fmt.Errorf(`"retokenize" %.80q is not a configured tokenizer: use one of %s (bridge_tokenizers, --bridge-tokenizers)`, name, strings.Join(names, ", "))
	}
	s.tokMu.Lock()
	defer s.tokMu.Unlock()
	if rt := s.toks[name]; rt != nil {
		return rt, 0, nil
	}
	rt, err := chattemplate.LoadDir(dir)
	if err != nil {
		s.log.Error("bridge: loading a configured tokenizer", "name", name, "folder", dir, "err", err)
		return nil, fasthttp.StatusServiceUnavailable, fmt.Errorf("tokenizer %q (bridge_tokenizers) does not load: %w; fix its folder or the setting", name, err)
	}
	if s.toks == nil {
		s.toks = map[string]*chattemplate.Retokenizer{}
	}
	s.toks[name] = rt
	return rt, 0, nil
}
