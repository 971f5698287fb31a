// Package export holds the stored tables of docs/contract.md §3 (their row
// types and, next to each, its column table: CallTable, RewardTable,
// RolloutTable, SpanTable; see columns.go), the Sink and Store interfaces
// every backend store implements, and the stores themselves in sub-packages
// (clickhouse, sqlite).
//
// Imports point downstream: gateway → capture → export. The trainer bridge
// reads captured data through the Store interface defined here.
package export

import (
	"cmp"
	"context"
)

// Token sources recorded in Call.TokenSource (docs/contract.md §3).
const (
	TokenSourceEngine      = "engine"      // ids returned by the engine and verified against usage
	TokenSourceTokenize    = "tokenize"    // ids obtained from the backend's /tokenize
	TokenSourceRetokenized = "retokenized" // ids produced by a local tokenizer
	TokenSourceNone        = "none"        // no usable ids
)

// Call is one row of the llm_calls table: one (request, choice).
type Call struct {
	SpanID            string
	TraceID           string
	RolloutID         string
	AttemptID         string
	TaskID            string
	AgentName         string
	SequenceID        uint64
	ChoiceIndex       uint32
	StartTimeUnixNano uint64
	EndTimeUnixNano   uint64
	TTFTNano          uint64
	// Endpoint is the route the client called, without the rollout prefix:
	// /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings,
	// or /v1/messages (Anthropic's Messages API, which the gateway serves
	// through the engine's chat completions: the row's bodies and ids are
	// that chat exchange's, openai.ChatShaped).
	Endpoint         string
	Model            string
	Backend          string
	PolicyVersion    string
	Stream           bool
	HTTPStatus       uint16
	Error            string
	RequestBody      string
	ResponseBody     string
	ResponseMessage  string
	PromptTokenIDs   []uint32
	ResponseTokenIDs []uint32
	ResponseLogprobs []float32
	TokenSource      string
	// TokenCheck is '' when the engine's ids passed every check, otherwise a
	// comma-separated list of the checks that failed (for example
	// "prompt_count,completion_count"). Extra column, not in the minimum contract.
	TokenCheck       string
	FinishReason     string
	PromptTokens     uint32
	CompletionTokens uint32
	// TurnKind says how this call's prompt ids continue the previous call of
	// the same (rollout, attempt): "first", "prefix" (starts with the previous
	// prompt + response ids, safe to merge), "resend", "template",
	// "retokenized", "edited", "no_ids", "unordered"; '' when not checked.
	// Extra column.
	TurnKind string
	// TurnPrefixLen is how many leading prompt ids equal the previous call's
	// prompt + response ids. Extra column.
	TurnPrefixLen uint32
	// TurnPrevSequenceID is the sequence id of the call compared with (0: none). Extra column.
	TurnPrevSequenceID uint64
	// PromptTokenSource and ResponseTokenSource say where each side's ids
	// came from, so that one side can be kept when the other could not be
	// obtained (llama.cpp leaves some sampled tokens out of its logprobs):
	// "engine" (returned by the engine, verified against usage), "tokenize"
	// (the backend's /tokenize, or ids read from logprobs, verified),
	// "engine_mismatch" (the engine's ids, failing that side's check), or
	// "none" (no ids stored for that side); '' on rows written before the
	// columns existed. TokenSource stays the verdict on the pair. Extra
	// columns.
	PromptTokenSource   string
	ResponseTokenSource string
	// APIKeyName names the client API key the call authenticated with (''
	// when client keys are off). The key itself is never stored. Extra column.
	APIKeyName string
	// Overrides is the JSON object of the request fields the gateway forced
	// whatever the client sent (sampling enforcement, the Agent Lightning
	// proxy's per-mode overrides), with the values sent: request_body keeps
	// what the client asked for. '' when nothing was forced. Extra column.
	Overrides string
	// BackendAttempts is how many times the gateway sent the call to a
	// backend: 1 when the first attempt answered, more after retries (a
	// refused connection, a retryable status on a route that retries them).
	// 0 on rows written before the column existed and on calls that never
	// reached a backend. Extra column.
	BackendAttempts uint16
	// TokenIn says how token-in mode (serve --token-in) served the call:
	// "extended" (prompt = the previous call's prompt + response ids + the
	// new messages' rendered ids; after a cut answer, the closing the
	// template renders after it comes between: tokenin.JoinCut), "first"
	// (rendered whole by the engine's template: the attempt's first call),
	// "whole:REASON" (rendered whole:
	// edited, assistant, no_new, template, not_ended, join) or
	// "passthrough:REASON" (sent as text, the engine rendered it: stream, n,
	// no_attempt, render, derender, kind, bad_messages); '' when token-in
	// mode was off. Extra column.
	TokenIn string
	// RetryCount is which try of its call this row is: 0 for the first,
	// n for the client's n-th retry of it (the SDK's x-stainless-retry-count
	// header with the body of an earlier call of the attempt, or the same
	// Idempotency-Key). Every try of a call has the call's sequence id; the
	// agent received the last answered one (AnsweredTries). Extra column.
	RetryCount uint16
	// RetryOf is the span id of the call's first try on a retry's rows, ''
	// on a first try. Extra column.
	RetryOf string
	// PolicyVersions gives the policy version of every response token when
	// more than one generation produced the response (a generation aborted
	// by a pause in mode abort and resumed after a weight update): segment
	// boundaries as a JSON array [[first token index, "version"], ...] in
	// token order, the first at 0; token i was sampled by the last segment
	// starting at or before i. '' when one generation produced it all
	// (policy_version is every token's). Extra column.
	PolicyVersions string
	// ParentSpanID is the span id of the client's W3C traceparent ('' when
	// none was sent), so exported spans nest under the caller's span. Not a
	// stored column: it travels to the OTLP sink only.
	ParentSpanID string
}

// CallTable is llm_calls' column table, in table order; the spool carries
// ParentSpanID too (before api_key_name).
var CallTable = NewTable("llm_calls",
	Col("span_id", func(c *Call) any { return &c.SpanID }, Codec("ZSTD(1)")),
	Col("trace_id", func(c *Call) any { return &c.TraceID }, Codec("ZSTD(1)")),
	Col("rollout_id", func(c *Call) any { return &c.RolloutID }),
	Col("attempt_id", func(c *Call) any { return &c.AttemptID }),
	Col("task_id", func(c *Call) any { return &c.TaskID }),
	Col("agent_name", func(c *Call) any { return &c.AgentName }, LowCard),
	Col("sequence_id", func(c *Call) any { return &c.SequenceID }),
	Col("choice_index", func(c *Call) any { return &c.ChoiceIndex }),
	Col("start_time_unix_nano", func(c *Call) any { return &c.StartTimeUnixNano }, Codec("DoubleDelta, ZSTD(1)")),
	Col("end_time_unix_nano", func(c *Call) any { return &c.EndTimeUnixNano }, Codec("DoubleDelta, ZSTD(1)")),
	Col("ttft_nano", func(c *Call) any { return &c.TTFTNano }, Codec("ZSTD(1)")),
	Col("endpoint", func(c *Call) any { return &c.Endpoint }, LowCard),
	Col("model", func(c *Call) any { return &c.Model }, LowCard),
	Col("backend", func(c *Call) any { return &c.Backend }, LowCard),
	Col("policy_version", func(c *Call) any { return &c.PolicyVersion }, LowCard),
	Col("stream", func(c *Call) any { return &c.Stream }),
	Col("http_status", func(c *Call) any { return &c.HTTPStatus }),
	Col("error", func(c *Call) any { return &c.Error }, Codec("ZSTD(3)")),
	Col("request_body", func(c *Call) any { return &c.RequestBody }, Codec("ZSTD(3)")),
	Col("response_body", func(c *Call) any { return &c.ResponseBody }, Codec("ZSTD(3)")),
	Col("response_message", func(c *Call) any { return &c.ResponseMessage }, Codec("ZSTD(3)")),
	Col("prompt_token_ids", func(c *Call) any { return &c.PromptTokenIDs }, Codec("ZSTD(1)")),
	Col("response_token_ids", func(c *Call) any { return &c.ResponseTokenIDs }, Codec("ZSTD(1)")),
	Col("response_logprobs", func(c *Call) any { return &c.ResponseLogprobs }, Codec("ZSTD(1)")),
	Col("token_source", func(c *Call) any { return &c.TokenSource }, LowCard),
	Col("token_check", func(c *Call) any { return &c.TokenCheck }, LowCard),
	Col("finish_reason", func(c *Call) any { return &c.FinishReason }, LowCard),
	Col("prompt_tokens", func(c *Call) any { return &c.PromptTokens }),
	Col("completion_tokens", func(c *Call) any { return &c.CompletionTokens }),
	Col("turn_kind", func(c *Call) any { return &c.TurnKind }, LowCard),
	Col("turn_prefix_len", func(c *Call) any { return &c.TurnPrefixLen }),
	Col("turn_prev_sequence_id", func(c *Call) any { return &c.TurnPrevSequenceID }),
	Col("parent_span_id", func(c *Call) any { return &c.ParentSpanID }, SpoolOnly),
	Col("api_key_name", func(c *Call) any { return &c.APIKeyName }, LowCard),
	Col("prompt_token_source", func(c *Call) any { return &c.PromptTokenSource }, LowCard, Since(3)),
	Col("response_token_source", func(c *Call) any { return &c.ResponseTokenSource }, LowCard, Since(3)),
	Col("overrides", func(c *Call) any { return &c.Overrides }, LowCard, Since(4)),
	Col("backend_attempts", func(c *Call) any { return &c.BackendAttempts }, Since(5)),
	Col("token_in", func(c *Call) any { return &c.TokenIn }, LowCard, Since(6)),
	Col("retry_count", func(c *Call) any { return &c.RetryCount }, Since(7)),
	Col("retry_of", func(c *Call) any { return &c.RetryOf }, Since(7)),
	Col("policy_versions", func(c *Call) any { return &c.PolicyVersions }, Since(8)),
)

// Reward is one row of the rewards table. SequenceID 0 is an episode-level reward.
type Reward struct {
	RolloutID    string
	AttemptID    string
	SequenceID   uint64
	Name         string
	Value        float64
	Source       string
	TimeUnixNano uint64
}

// RewardTable is the rewards table's column table.
var RewardTable = NewTable("rewards",
	Col("rollout_id", func(r *Reward) any { return &r.RolloutID }),
	Col("attempt_id", func(r *Reward) any { return &r.AttemptID }),
	Col("sequence_id", func(r *Reward) any { return &r.SequenceID }),
	Col("name", func(r *Reward) any { return &r.Name }, LowCard),
	Col("value", func(r *Reward) any { return &r.Value }),
	Col("source", func(r *Reward) any { return &r.Source }, LowCard),
	Col("time_unix_nano", func(r *Reward) any { return &r.TimeUnixNano }, Codec("DoubleDelta, ZSTD(1)")),
)

// Rollout is one row of the rollouts table; the latest row (by UpdatedUnixNano)
// per rollout wins.
type Rollout struct {
	RolloutID string
	AttemptID string
	TaskID    string
	// GroupID is the training group, the trainer's uid (docs/contract.md §3): one per
	// task per enqueue call of POST /api/v1/tasks (a training step), or given
	// to POST /api/v1/rollouts; '' when the rollout has none (rows written
	// before the column existed read back as ''). Every row of a rollout,
	// status updates included, carries it, since the latest row wins.
	GroupID         string
	Status          string
	Metadata        string // JSON
	CreatedUnixNano uint64
	UpdatedUnixNano uint64
}

// RolloutTable is the rollouts table's column table.
var RolloutTable = NewTable("rollouts",
	Col("rollout_id", func(r *Rollout) any { return &r.RolloutID }),
	Col("attempt_id", func(r *Rollout) any { return &r.AttemptID }),
	Col("task_id", func(r *Rollout) any { return &r.TaskID }),
	Col("group_id", func(r *Rollout) any { return &r.GroupID }, Since(2)),
	Col("status", func(r *Rollout) any { return &r.Status }, LowCard),
	Col("metadata", func(r *Rollout) any { return &r.Metadata }, Codec("ZSTD(3)")),
	Col("created_unix_nano", func(r *Rollout) any { return &r.CreatedUnixNano }),
	Col("updated_unix_nano", func(r *Rollout) any { return &r.UpdatedUnixNano }),
)

// Span is one agent span received over OTLP (POST /v1/traces), a row of the
// agent_spans table: what the agent itself reported, for example a tool call
// and whether it failed. Extra table, not in the minimum contract.
type Span struct {
	RolloutID         string
	AttemptID         string
	TraceID           string // 32 hex digits
	SpanID            string // 16 hex digits
	ParentSpanID      string // '' for a root span
	Name              string
	Kind              string // internal, server, client, producer, consumer, unspecified
	ServiceName       string // resource attribute service.name
	ToolName          string // gen_ai.tool.name or tool.name, '' when not a tool span
	ToolCallID        string // gen_ai.tool.call.id, '' when absent
	StatusCode        string // unset, ok, error
	StatusMessage     string
	StartTimeUnixNano uint64
	EndTimeUnixNano   uint64
	Attributes        string // span attributes as a JSON object
	ReceivedUnixNano  uint64
}

// SpanTable is the agent_spans table's column table.
var SpanTable = NewTable("agent_spans",
	Col("rollout_id", func(s *Span) any { return &s.RolloutID }),
	Col("attempt_id", func(s *Span) any { return &s.AttemptID }),
	Col("trace_id", func(s *Span) any { return &s.TraceID }),
	Col("span_id", func(s *Span) any { return &s.SpanID }),
	Col("parent_span_id", func(s *Span) any { return &s.ParentSpanID }),
	Col("name", func(s *Span) any { return &s.Name }, LowCard),
	Col("kind", func(s *Span) any { return &s.Kind }, LowCard),
	Col("service_name", func(s *Span) any { return &s.ServiceName }, LowCard),
	Col("tool_name", func(s *Span) any { return &s.ToolName }, LowCard),
	Col("tool_call_id", func(s *Span) any { return &s.ToolCallID }),
	Col("status_code", func(s *Span) any { return &s.StatusCode }, LowCard),
	Col("status_message", func(s *Span) any { return &s.StatusMessage }),
	Col("start_time_unix_nano", func(s *Span) any { return &s.StartTimeUnixNano }, Codec("DoubleDelta, ZSTD(1)")),
	Col("end_time_unix_nano", func(s *Span) any { return &s.EndTimeUnixNano }, Codec("DoubleDelta, ZSTD(1)")),
	Col("attributes", func(s *Span) any { return &s.Attributes }, Codec("ZSTD(3)"), SQLiteDefault("'{}'")),
	Col("received_unix_nano", func(s *Span) any { return &s.ReceivedUnixNano }),
)

// Batch is what a sink writes at once. Any of its slices may be empty.
type Batch struct {
	Calls    []Call
	Rewards  []Reward
	Rollouts []Rollout
	Spans    []Span
}

// Len is the number of rows in the batch.
func (b *Batch) Len() int { return len(b.Calls) + len(b.Rewards) + len(b.Rollouts) + len(b.Spans) }

// Sink writes batches of rows. Write returns only after the rows are stored
// (acknowledged by the server); an error means none or only some were stored
// and the caller decides whether to retry.
type Sink interface {
	Write(ctx context.Context, b *Batch) error
}

// OnceWriter is implemented by sinks whose Write can store a batch without
// confirming it: ClickHouse commits an insert, then the connection drops
// before its answer reaches the client. WriteOnce writes only the rows of b
// that are not stored yet, so a batch sent again after a failed or
// unconfirmed Write ends up stored exactly once. It costs a read per table,
// so callers use it only for batches that may have been written before
// (retries and spool replays), never on the first try.
type OnceWriter interface {
	WriteOnce(ctx context.Context, b *Batch) error
}

// WriteAgain writes b to s once more after an earlier Write of the same rows
// may have stored some of them: through WriteOnce when s has it, else Write
// (sinks whose writes are transactions, such as SQLite, never leave a batch
// half or silently stored).
func WriteAgain(ctx context.Context, s Sink, b *Batch) error {
	if o, ok := s.(OnceWriter); ok {
		return o.WriteOnce(ctx, b)
	}
	return s.Write(ctx, b)
}

// Result is the outcome of an ad-hoc SQL query: column names and rows, each
// value already rendered as text for printing.
type Result struct {
	Columns []string
	Rows    [][]string
}

// CallFilter selects llm_calls rows. Empty fields match everything.
type CallFilter struct {
	RolloutID string
	AttemptID string
	SpanID    string
	// FromSequence keeps the calls whose sequence id is at least this (0:
	// every call): with Limit, one page of an attempt's calls.
	FromSequence uint64
	Limit        int // 0 = no limit
	// Omit leaves the bodies it names out of the rows read (read as "").
	Omit ReadOptions
}

// CallKey names one stored choice of one call: what a reader that shows
// one call asks for, so that it reads that row alone.
type CallKey struct {
	RolloutID string
	// AttemptID is the call's attempt; "" takes the attempt whose call of
	// this sequence id and choice started last.
	AttemptID   string
	SequenceID  uint64
	ChoiceIndex uint32
}

// Conditions returns the WHERE conditions (joined with AND) and their
// arguments that select the rows of k, with ? placeholders. Readers order
// them by start time, latest first, and keep the first.
func (k CallKey) Conditions() (string, []any) {
	where, args := "rollout_id = ? AND sequence_id = ? AND choice_index = ?", []any{k.RolloutID, k.SequenceID, k.ChoiceIndex}
	if k.AttemptID != "" {
		where, args = where+" AND attempt_id = ?", append(args, k.AttemptID)
	}
	return where, args
}

// RolloutDetail is what GET /api/v1/rollouts/{id} returns: the latest state of
// each attempt, the calls (as stored), and the rewards.
type RolloutDetail struct {
	Attempts []Rollout
	Calls    []Call
	Rewards  []Reward
}

// BulkRolloutReader is implemented by stores that read many rollouts in a
// few queries (ClickHouse, where a round trip per rollout is slow).
type BulkRolloutReader interface {
	Rollouts(ctx context.Context, ids []string, opt ReadOptions) (map[string]*RolloutDetail, error)
}

// RowStreamer is implemented by stores that hand out the rows of ad-hoc SQL
// one at a time, rendered as Store.Query renders them, so a reader of many
// rows (the trainer bridge's selection) does not hold them all; f may keep
// the strings but not the slice.
type RowStreamer interface {
	QueryEach(ctx context.Context, query string, f func(row []string) error) error
}

// CollectRows gathers what a row-by-row query hands out into a Result: each
// runs the query, telling columns its column names and row each row (a
// fresh slice). Stores build Query on their QueryEach with it.
func CollectRows(each func(columns func([]string), row func([]string) error) error) (*Result, error) {
	res := &Result{}
	err := each(func(cols []string) { res.Columns = cols }, func(row []string) error {
		res.Rows = append(res.Rows, row)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// ReadOptions leave out of a bulk read the columns its reader does not need.
type ReadOptions struct {
	// NoResponseBody leaves Call.ResponseBody empty: the engine's raw
	// answer, which the trainer bridge never reads and which is a call's
	// largest column when logprobs were asked for.
	NoResponseBody bool
	// NoRequestBody leaves Call.RequestBody empty (the whole conversation
	// so far: the bridge needs it only to retokenize and for AIR rules that
	// read the request).
	NoRequestBody bool
	// NoAttempts leaves RolloutDetail.Attempts empty in a bulk read
	// (BulkRolloutReader): the trainer bridge has its attempts from its
	// selection, and the query per chunk cost ClickHouse about 1.5 µs of
	// CPU per call read.
	NoAttempts bool
	// NoCalls leaves RolloutDetail.Calls empty.
	NoCalls bool
}

// Store is a Sink that can also be read: the embedded SQLite store and ClickHouse.
type Store interface {
	Sink
	Reader
	// Name is the store's kind, used as the "sink" metric label ("clickhouse", "sqlite").
	Name() string
	// Query runs ad-hoc SQL (rollgate sql) and renders every value as text.
	Query(ctx context.Context, query string) (*Result, error)
	// Calls reads llm_calls rows ordered by rollout, attempt, sequence id, choice.
	Calls(ctx context.Context, f CallFilter) ([]Call, error)
	// Call reads the one row k names (the latest started when several
	// match), or nil when none does: a reader that shows one call reads
	// only its row.
	Call(ctx context.Context, k CallKey) (*Call, error)
	// Rollout reads a rollout's attempts, calls and rewards: ReadRollout
	// with no options.
	Rollout(ctx context.Context, rolloutID string) (*RolloutDetail, error)
	// ReadRollout is Rollout without what opt leaves out (a reader of a
	// rollout's attempts and rewards alone sets NoCalls: a rollout's calls
	// and their bodies are unbounded).
	ReadRollout(ctx context.Context, rolloutID string, opt ReadOptions) (*RolloutDetail, error)
	// TrainingSteps aggregates the attempts of the latest training steps
	// along q's axis in the store (one row per step, at most q.Limit), the
	// latest first: what the viewer's training view draws.
	TrainingSteps(ctx context.Context, q TrainingQuery) ([]TrainingStep, error)
	// Close flushes and releases the store.
	Close() error
}

// CompareTurns orders two calls of one attempt as they were made: by
// sequence id, then choice index. For sorting an attempt's calls (stable
// sorts keep the store's order of ties).
func CompareTurns(a, b *Call) int {
	return cmp.Or(cmp.Compare(a.SequenceID, b.SequenceID), cmp.Compare(a.RetryCount, b.RetryCount), cmp.Compare(a.ChoiceIndex, b.ChoiceIndex))
}

// Answered reports whether the agent read c's answer: no error (a client
// that went away is an error) and a status below 300.
func (c *Call) Answered() bool { return c.Error == "" && c.HTTPStatus < 300 }

// SupersededTries marks the rows of calls (ordered by rollout, attempt,
// then CompareTurns) that are tries the agent did not receive: every try of a
// sequence id (RetryCount) but its last answered one, when one was
// answered. A sequence id none of whose tries was answered keeps them all.
// nil when no row is superseded (the usual case: no retries).
func SupersededTries(calls []Call) []bool {
	var out []bool
	for i := 0; i < len(calls); {
		j, retried := i+1, false
		for j < len(calls) && calls[j].SequenceID == calls[i].SequenceID &&
			calls[j].AttemptID == calls[i].AttemptID && calls[j].RolloutID == calls[i].RolloutID {
			retried = retried || calls[j].RetryCount != calls[i].RetryCount
			j++
		}
		if retried {
			answered, ok := uint16(0), false
			for k := i; k < j; k++ {
				if calls[k].Answered() && (!ok || calls[k].RetryCount > answered) {
					answered, ok = calls[k].RetryCount, true
				}
			}
			for k := i; ok && k < j; k++ {
				if calls[k].RetryCount != answered {
					if out == nil {
						out = make([]bool, len(calls))
					}
					out[k] = true
				}
			}
		}
		i = j
	}
	return out
}
