package controlplane

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// reportedCall is one self-reported call: a (prompt, response) triplet with
// optional ids and reward.
type reportedCall struct {
	AttemptID        string          `json:"attempt_id"`
	AgentName        string          `json:"agent_name"`
	Model            string          `json:"model"`
	Endpoint         string          `json:"endpoint"`
	Request          json.RawMessage `json:"request"`
	Messages         json.RawMessage `json:"messages"`
	Prompt           json.RawMessage `json:"prompt"`
	Response         json.RawMessage `json:"response"`
	PromptTokenIDs   []uint32        `json:"prompt_token_ids"`
	ResponseTokenIDs []uint32        `json:"response_token_ids"`
	ResponseLogprobs []float32       `json:"response_logprobs"`
	TokenSource      string          `json:"token_source"`
	FinishReason     string          `json:"finish_reason"`
	PromptTokens     *uint32         `json:"prompt_tokens"`
	CompletionTokens *uint32         `json:"completion_tokens"`
	StartTimeNano    uint64          `json:"start_time_unix_nano"`
	EndTimeNano      uint64          `json:"end_time_unix_nano"`
	Reward           *float64        `json:"reward"`
	Error            string          `json:"error"`
}

// postCalls stores self-reported calls for agents that cannot be proxied:
// {"attempt_id"?, "calls": [...]}, a list, or one call. Each gets the next
// sequence id of its (rollout, attempt) and is acknowledged only once stored.
func (s *Server) postCalls(ctx *fasthttp.RequestCtx, rolloutID string) {
	body := strings.TrimSpace(string(ctx.PostBody()))
	var list []reportedCall
	var attempt string
	var err error
	switch {
	case strings.HasPrefix(body, "["):
		err = strictJSON(body, &list)
	case strings.Contains(body, `"calls"`):
		var w struct {
			AttemptID string         `json:"attempt_id"`
			Calls     []reportedCall `json:"calls"`
		}
		err = strictJSON(body, &w)
		list, attempt = w.Calls, w.AttemptID
	default:
		var one reportedCall
		err = strictJSON(body, &one)
		list = []reportedCall{one}
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body: "+err.Error())
		return
	}
	if len(list) == 0 {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "no calls given")
		return
	}
	if attempt != "" && !gateway.ValidID([]byte(attempt)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "attempt_id must be "+gateway.IDCharset)
		return
	}
	for i := range list {
		switch rc := &list[i]; {
		case rc.AttemptID != "" && !gateway.ValidID([]byte(rc.AttemptID)):
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("call %d: attempt_id must be %s", i, gateway.IDCharset))
			return
		case !gateway.ValidName([]byte(rc.AgentName)):
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("call %d: agent_name must be at most 256 bytes of UTF-8 without control characters", i))
			return
		}
	}
	if s.queue.Load() != nil && attempt == "" {
		c, cancel := s.storeCtx()
		if st, err := s.queue.Load().Get(c, rolloutID); err == nil {
			attempt = st.AttemptID
		}
		cancel()
	}
	taskID := ""
	if ri, ok := s.rollouts.Load(rolloutID); ok {
		taskID = ri.(*rolloutInfo).taskID
	}
	now := uint64(time.Now().UnixNano())
	var b export.Batch
	out := make([]map[string]any, 0, len(list))
	for i := range list {
		rc := &list[i]
		call, msg := reportedToCall(rc, now)
		if msg != "" {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("call %d: %s", i, msg))
			return
		}
		if rc.AttemptID == "" {
			rc.AttemptID = attempt
		}
		call.RolloutID, call.AttemptID, call.TaskID = rolloutID, rc.AttemptID, taskID
		b.Calls = append(b.Calls, call)
	}
	// Sequence ids are taken only once the whole body is valid.
	for i := range b.Calls {
		cl := &b.Calls[i]
		seq, err := s.gw.NextSequenceID(rolloutID, cl.AttemptID)
		if err != nil {
			s.m.CallsRejected.WithLabelValues(rejectSequenceStore).Inc()
			s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reserving sequence ids (nothing stored; retry): "+err.Error())
			return
		}
		cl.SequenceID = seq
		if r := list[i].Reward; r != nil {
			b.Rewards = append(b.Rewards, export.Reward{RolloutID: rolloutID, AttemptID: cl.AttemptID,
				SequenceID: cl.SequenceID, Name: "primary", Value: *r, Source: "reported", TimeUnixNano: now})
		}
		out = append(out, map[string]any{"span_id": cl.SpanID, "attempt_id": cl.AttemptID,
			"sequence_id": cl.SequenceID, "token_source": cl.TokenSource})
	}
	c, cancel := s.storeCtx()
	defer cancel()
	if err := s.store.Write(c, &b); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing reported calls (nothing stored; retry): "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollout_id": rolloutID, "calls": out})
}

// reportedToCall turns a reported triplet into an llm_calls row, or says
// what is wrong with it.
func reportedToCall(rc *reportedCall, now uint64) (export.Call, string) {
	c := export.Call{SpanID: randomHex(8), TraceID: randomHex(16), AgentName: rc.AgentName, Model: rc.Model,
		Endpoint: rc.Endpoint, Backend: "reported", HTTPStatus: 200, Error: rc.Error, FinishReason: rc.FinishReason,
		PromptTokenIDs: rc.PromptTokenIDs, ResponseTokenIDs: rc.ResponseTokenIDs, ResponseLogprobs: rc.ResponseLogprobs,
		StartTimeUnixNano: rc.StartTimeNano, EndTimeUnixNano: rc.EndTimeNano}
	if c.Endpoint == "" {
		c.Endpoint = "/v1/chat/completions"
	}
	if c.StartTimeUnixNano == 0 {
		c.StartTimeUnixNano = now
	}
	if c.EndTimeUnixNano == 0 {
		c.EndTimeUnixNano = now
	}
	// The request as the agent would have sent it.
	switch {
	case len(rc.Request) > 0:
		if !json.Valid(rc.Request) {
			return c, `"request" is not JSON`
		}
		c.RequestBody = string(rc.Request)
	case len(rc.Messages) > 0:
		req := map[string]json.RawMessage{"messages": rc.Messages}
		if rc.Model != "" {
			req["model"], _ = json.Marshal(rc.Model)
		}
		b, err := json.Marshal(req)
		if err != nil {
			return c, `"messages" is not JSON`
		}
		c.RequestBody = string(b)
	case len(rc.Prompt) > 0:
		b, err := json.Marshal(map[string]json.RawMessage{"prompt": rc.Prompt})
		if err != nil {
			return c, `"prompt" is not JSON`
		}
		c.RequestBody = string(b)
		if rc.Endpoint == "" {
			c.Endpoint = "/v1/completions"
		}
	default:
		return c, `one of "request", "messages" or "prompt" is required`
	}
	// The response: a string is the assistant's text, an object a message.
	switch {
	case len(rc.Response) == 0:
		return c, `"response" is required`
	case rc.Response[0] == '"':
		var text string
		if err := json.Unmarshal(rc.Response, &text); err != nil {
			return c, `"response" is not a JSON string`
		}
		b, _ := json.Marshal(map[string]string{"role": "assistant", "content": text})
		c.ResponseMessage = string(b)
	case rc.Response[0] == '{' && json.Valid(rc.Response):
		c.ResponseMessage = string(rc.Response)
	default:
		return c, `"response" must be a string or a message object`
	}
	c.ResponseBody = `{"object":"rollgate.reported_call","choices":[{"index":0,"message":` + c.ResponseMessage + `}]}`
	switch rc.TokenSource {
	case "":
		c.TokenSource = export.TokenSourceNone
		if len(rc.ResponseTokenIDs) > 0 {
			c.TokenSource = "reported"
		}
	case export.TokenSourceEngine, export.TokenSourceTokenize, export.TokenSourceRetokenized, export.TokenSourceNone:
		c.TokenSource = rc.TokenSource
	default:
		return c, fmt.Sprintf("token_source %q is not one of engine, tokenize, retokenized, none", rc.TokenSource)
	}
	if c.TokenSource != export.TokenSourceNone && len(rc.ResponseTokenIDs) == 0 {
		return c, fmt.Sprintf("token_source %q needs response_token_ids", c.TokenSource)
	}
	if len(rc.ResponseLogprobs) > 0 && len(rc.ResponseLogprobs) != len(rc.ResponseTokenIDs) {
		return c, fmt.Sprintf("%d response_logprobs for %d response_token_ids", len(rc.ResponseLogprobs), len(rc.ResponseTokenIDs))
	}
	c.PromptTokens, c.CompletionTokens = uint32(len(rc.PromptTokenIDs)), uint32(len(rc.ResponseTokenIDs))
	if rc.PromptTokens != nil {
		c.PromptTokens = *rc.PromptTokens
	}
	if rc.CompletionTokens != nil {
		c.CompletionTokens = *rc.CompletionTokens
	}
	return c, ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
