package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// Ranges of GET /api/v1/rollouts's numbers.
const (
	maxListLimit = 10000 // limit, and the number of ids
	maxWaitS     = 600   // wait_s
)

// listRollouts answers GET /api/v1/rollouts?status=&after=&limit=&ids=&wait_s=&summary=.
// With after (or status=completed) it pages completed rollouts in completion
// order; next_after is the cursor for the next page. wait_s long-polls until
// at least one rollout matches.
func (s *Server) listRollouts(ctx *fasthttp.RequestCtx) {
	if !s.needQueue(ctx) {
		return
	}
	args := ctx.QueryArgs()
	f := tasks.ListFilter{Status: string(args.Peek("status"))}
	var err error
	num := func(name string) int64 {
		v := args.Peek(name)
		if len(v) == 0 || err != nil {
			return 0
		}
		var n int64
		n, err = strconv.ParseInt(string(v), 10, 64)
		if err == nil && n < 0 {
			err = fmt.Errorf("%s must not be negative", name)
		}
		return n
	}
	f.After, f.Limit = num("after"), int(num("limit"))
	waitS := num("wait_s")
	switch {
	case err != nil:
	case f.Limit > maxListLimit:
		err = fmt.Errorf("limit %d is out of range: 0 (the default, 100) to %d", f.Limit, maxListLimit)
	case waitS > maxWaitS:
		err = fmt.Errorf("wait_s %d is out of range: 0 to %d seconds", waitS, maxWaitS)
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "bad query parameter: "+err.Error())
		return
	}
	f.Cursor = args.Has("after") || f.Status == "completed"
	if ids := string(args.Peek("ids")); ids != "" {
		f.IDs = strings.Split(ids, ",")
		if len(f.IDs) > maxListLimit {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("bad query parameter: ids lists %d rollouts, at most %d", len(f.IDs), maxListLimit))
			return
		}
		for _, id := range f.IDs {
			if !gateway.ValidID([]byte(id)) {
				s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "bad query parameter: each of ids must be "+gateway.IDCharset)
				return
			}
		}
	}
	switch f.Status {
	case "", "completed", tasks.StatusQueued, tasks.StatusRunning, tasks.StatusSucceeded, tasks.StatusFailed, tasks.StatusCancelled:
	default:
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("status %q is not one of queued, running, succeeded, failed, cancelled, completed", f.Status))
		return
	}
	deadline := time.Now().Add(time.Duration(waitS) * time.Second)
	var list []tasks.State
	var next int64
	for {
		c, cancel := s.storeCtx()
		list, next, err = s.queue.Load().List(c, f)
		cancel()
		if err != nil || len(list) > 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-s.stop:
			deadline = time.Now()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	summary := string(args.Peek("summary")) != "0"
	out := make([]map[string]any, 0, len(list))
	c, cancel := s.storeCtx()
	defer cancel()
	for i := range list {
		v := stateView(&list[i])
		if summary {
			if err := s.addSummary(c, v, list[i].RolloutID); err != nil {
				s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout "+list[i].RolloutID+": "+err.Error())
				return
			}
		}
		out = append(out, v)
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollouts": out, "next_after": next})
}

// addSummary adds the rollout's rewards and a summary of its calls (of the
// final attempt) to v.
func (s *Server) addSummary(c context.Context, v map[string]any, rolloutID string) error {
	attempt, _ := v["attempt_id"].(string)
	d, err := s.store.ReadRollout(c, rolloutID, export.ReadOptions{NoCalls: true})
	if err == nil { // the final attempt's calls, without their bodies ("" reads every attempt's: filtered below)
		d.Calls, err = s.store.Calls(c, export.CallFilter{RolloutID: rolloutID, AttemptID: attempt,
			Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
	}
	if err != nil {
		return err
	}
	spans := map[string]bool{}
	var prompt, completion uint64
	errs, noIDs := 0, 0
	for _, cl := range d.Calls {
		if cl.AttemptID != attempt {
			continue
		}
		if !spans[cl.SpanID] {
			spans[cl.SpanID] = true
			prompt += uint64(cl.PromptTokens)
			if cl.Error != "" || cl.HTTPStatus >= 400 {
				errs++
			}
		}
		completion += uint64(cl.CompletionTokens)
		if cl.TokenSource == export.TokenSourceNone || cl.TokenSource == "" {
			noIDs++
		}
	}
	v["calls"] = map[string]any{"calls": len(spans), "prompt_tokens": prompt, "completion_tokens": completion,
		"errors": errs, "choices_without_ids": noIDs}
	rewards := []map[string]any{}
	for _, r := range d.Rewards {
		if r.AttemptID == "" || r.AttemptID == attempt {
			rewards = append(rewards, rewardView(r))
		}
	}
	v["rewards"] = rewards
	return nil
}
