package clickhouse

import (
	"strings"

	"github.com/rollgate/rollgate/export"
)

// colDef is one column as sent in an insert: its name and its plain
// ClickHouse type (LowCardinality columns are sent as String).
type colDef struct {
	name, typ string
}

// Column order of every insert and select; callValues and callDest follow it.
var (
	callCols = []colDef{
		{"span_id", "String"},
		{"trace_id", "String"},
		{"rollout_id", "String"},
		{"attempt_id", "String"},
		{"task_id", "String"},
		{"agent_name", "String"},
		{"sequence_id", "UInt64"},
		{"choice_index", "UInt32"},
		{"start_time_unix_nano", "UInt64"},
		{"end_time_unix_nano", "UInt64"},
		{"ttft_nano", "UInt64"},
		{"endpoint", "String"},
		{"model", "String"},
		{"backend", "String"},
		{"policy_version", "String"},
		{"stream", "UInt8"},
		{"http_status", "UInt16"},
		{"error", "String"},
		{"request_body", "String"},
		{"response_body", "String"},
		{"response_message", "String"},
		{"prompt_token_ids", "Array(UInt32)"},
		{"response_token_ids", "Array(UInt32)"},
		{"response_logprobs", "Array(Float32)"},
		{"token_source", "String"},
		{"token_check", "String"},
		{"finish_reason", "String"},
		{"prompt_tokens", "UInt32"},
		{"completion_tokens", "UInt32"},
		{"turn_kind", "String"},
		{"turn_prefix_len", "UInt32"},
		{"turn_prev_sequence_id", "UInt64"},
		{"api_key_name", "String"},
	}
	rewardCols = []colDef{
		{"rollout_id", "String"},
		{"attempt_id", "String"},
		{"sequence_id", "UInt64"},
		{"name", "String"},
		{"value", "Float64"},
		{"source", "String"},
		{"time_unix_nano", "UInt64"},
	}
	rolloutCols = []colDef{
		{"rollout_id", "String"},
		{"attempt_id", "String"},
		{"task_id", "String"},
		{"group_id", "String"},
		{"status", "String"},
		{"metadata", "String"},
		{"created_unix_nano", "UInt64"},
		{"updated_unix_nano", "UInt64"},
	}
	spanCols = []colDef{
		{"rollout_id", "String"},
		{"attempt_id", "String"},
		{"trace_id", "String"},
		{"span_id", "String"},
		{"parent_span_id", "String"},
		{"name", "String"},
		{"kind", "String"},
		{"service_name", "String"},
		{"tool_name", "String"},
		{"tool_call_id", "String"},
		{"status_code", "String"},
		{"status_message", "String"},
		{"start_time_unix_nano", "UInt64"},
		{"end_time_unix_nano", "UInt64"},
		{"attributes", "String"},
		{"received_unix_nano", "UInt64"},
	}
)

// names joins the column names with ", ".
func names(cols []colDef) string {
	s := make([]string, len(cols))
	for i, c := range cols {
		s[i] = c.name
	}
	return strings.Join(s, ", ")
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// nonNil returns s, or an empty slice when s is nil (the driver wants a slice).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func callValues(c *export.Call) []any {
	return []any{
		c.SpanID, c.TraceID, c.RolloutID, c.AttemptID, c.TaskID, c.AgentName,
		c.SequenceID, c.ChoiceIndex, c.StartTimeUnixNano, c.EndTimeUnixNano, c.TTFTNano,
		c.Endpoint, c.Model, c.Backend, c.PolicyVersion, b2u8(c.Stream), c.HTTPStatus,
		c.Error, c.RequestBody, c.ResponseBody, c.ResponseMessage,
		nonNil(c.PromptTokenIDs), nonNil(c.ResponseTokenIDs), nonNil(c.ResponseLogprobs),
		c.TokenSource, c.TokenCheck, c.FinishReason, c.PromptTokens, c.CompletionTokens,
		c.TurnKind, c.TurnPrefixLen, c.TurnPrevSequenceID, c.APIKeyName,
	}
}

func callDest(c *export.Call, stream *uint8) []any {
	return []any{
		&c.SpanID, &c.TraceID, &c.RolloutID, &c.AttemptID, &c.TaskID, &c.AgentName,
		&c.SequenceID, &c.ChoiceIndex, &c.StartTimeUnixNano, &c.EndTimeUnixNano, &c.TTFTNano,
		&c.Endpoint, &c.Model, &c.Backend, &c.PolicyVersion, stream, &c.HTTPStatus,
		&c.Error, &c.RequestBody, &c.ResponseBody, &c.ResponseMessage,
		&c.PromptTokenIDs, &c.ResponseTokenIDs, &c.ResponseLogprobs,
		&c.TokenSource, &c.TokenCheck, &c.FinishReason, &c.PromptTokens, &c.CompletionTokens,
		&c.TurnKind, &c.TurnPrefixLen, &c.TurnPrevSequenceID, &c.APIKeyName,
	}
}

func rewardValues(r *export.Reward) []any {
	return []any{r.RolloutID, r.AttemptID, r.SequenceID, r.Name, r.Value, r.Source, r.TimeUnixNano}
}

func rewardDest(r *export.Reward) []any {
	return []any{&r.RolloutID, &r.AttemptID, &r.SequenceID, &r.Name, &r.Value, &r.Source, &r.TimeUnixNano}
}

func rolloutValues(r *export.Rollout) []any {
	return []any{r.RolloutID, r.AttemptID, r.TaskID, r.GroupID, r.Status, r.Metadata, r.CreatedUnixNano, r.UpdatedUnixNano}
}

func rolloutDest(r *export.Rollout) []any {
	return []any{&r.RolloutID, &r.AttemptID, &r.TaskID, &r.GroupID, &r.Status, &r.Metadata, &r.CreatedUnixNano, &r.UpdatedUnixNano}
}

func spanValues(s *export.Span) []any {
	return []any{s.RolloutID, s.AttemptID, s.TraceID, s.SpanID, s.ParentSpanID, s.Name, s.Kind, s.ServiceName,
		s.ToolName, s.ToolCallID, s.StatusCode, s.StatusMessage, s.StartTimeUnixNano, s.EndTimeUnixNano,
		s.Attributes, s.ReceivedUnixNano}
}
