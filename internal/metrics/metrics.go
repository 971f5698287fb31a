// Package metrics holds rollgate's Prometheus collectors, registered on one
// registry that /metrics exposes. Names follow Prometheus conventions: a
// rollgate_ prefix, base units (seconds), _total for counters.
package metrics

import (
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is the set of collectors shared by the gateway, capture and export.
type Metrics struct {
	Registry *prometheus.Registry

	// Requests counts proxied requests by model, backend, endpoint and status code.
	Requests *prometheus.CounterVec
	// CallsRejected counts agent calls refused before they were admitted
	// (never proxied, never captured, no sequence id), by reason:
	// unauthenticated, invalid_id, concurrency_limit, paused, sequence_store
	// (no sequence id could be reserved: the database is down or slow); and
	// requests to routes that answer without a credential refused as
	// browser-driven or rebound (gateway/crosssite.go): host, cross_site,
	// content_type.
	CallsRejected *prometheus.CounterVec
	// SequenceEvictions counts (rollout, attempt) entries moved out of the
	// gateway's in-memory sequence table to keep it within its bounds.
	SequenceEvictions prometheus.Counter
	// SequenceWaits counts admitted calls that waited for a block of
	// sequence ids to be reserved in the database: the engine had answered
	// before the reservation (begun when the call was admitted, beside the
	// engine's work) was committed, or the call was answered without the
	// engine (an error) meanwhile.
	SequenceWaits prometheus.Counter
	// TokenIn counts chat calls under token-in mode by outcome ("extended",
	// "first", "whole:REASON", "passthrough:REASON"; the token_in column).
	TokenIn *prometheus.CounterVec
	// TokenInResumes counts token-in generations a pause in mode abort
	// interrupted, by outcome: aborted (the engine stopped it for the
	// pause), resumed (the rest was sent to the replica serving after the
	// resume and the engine accepted it), finished (its max_tokens were
	// all generated before the abort took effect: it ended there with
	// finish reason length), failed (it could not be continued: the client
	// got an error naming the response token it stopped at).
	TokenInResumes *prometheus.CounterVec
	// Retries counts calls that carried a client retry signal
	// (x-stainless-retry-count > 0, or an Idempotency-Key seen before) by
	// outcome: "matched" (an earlier try of the attempt was found: the call
	// kept its sequence id) or "unmatched" (none was: a new call).
	Retries *prometheus.CounterVec
	// TokenInEvictions counts attempts token-in mode forgot to stay within
	// its bounds.
	TokenInEvictions prometheus.Counter
	// RequestDuration is the time from request arrival to the last response byte.
	RequestDuration *prometheus.HistogramVec
	// TTFT is the time from request arrival to the first streamed event.
	TTFT *prometheus.HistogramVec
	// Tokens counts tokens by model and kind (prompt, completion) as reported in usage.
	Tokens *prometheus.CounterVec
	// InFlight is the number of requests being proxied right now.
	InFlight prometheus.Gauge
	// BackendInFlight is the number of outstanding requests per backend replica.
	BackendInFlight *prometheus.GaugeVec
	// RoutingAffinity counts replica selections of rollout-affine pools by
	// outcome: hit (the rollout's own replica), spill (the next in its
	// order: its own was unhealthy, overloaded or already tried), fallback
	// (no rollout id or no healthy replica: least outstanding).
	RoutingAffinity *prometheus.CounterVec

	// CaptureQueueDepth is the number of calls waiting in the capture queue.
	CaptureQueueDepth prometheus.Gauge
	// CaptureQueueCapacity is the capture queue's capacity.
	CaptureQueueCapacity prometheus.Gauge
	// CaptureDropped counts calls dropped because the capture queue was full.
	CaptureDropped prometheus.Counter
	// CapturedRows counts llm_calls rows produced by capture.
	CapturedRows prometheus.Counter
	// TokenIDs counts captured rows by token_source (engine, engine_mismatch, none, ...).
	TokenIDs *prometheus.CounterVec

	// TokenFallback counts calls whose ids were completed after the fact
	// (/tokenize, ids in logprobs), by result (filled, partial: one side
	// only, failed).
	TokenFallback *prometheus.CounterVec

	// Detok counts rows of the detokenisation check by outcome (match,
	// parsed, mismatch, skipped, decode_error).
	Detok *prometheus.CounterVec

	// Redactions counts captured rows changed by a redaction rule, by rule.
	Redactions *prometheus.CounterVec

	// AgentSpans counts agent spans received on /v1/traces, by whether they
	// were attributed to a rollout ("true", "false") and by result
	// ("stored", "rejected").
	AgentSpans *prometheus.CounterVec

	// Turns counts captured calls of rollouts by how their prompt continues
	// the previous call (prefix, template, retokenized, edited, ...).
	Turns *prometheus.CounterVec

	// ExportBatches counts batches written, by sink and result (ok, error).
	ExportBatches *prometheus.CounterVec
	// ExportRows counts rows written, by sink and table.
	ExportRows *prometheus.CounterVec
	// ExportErrors counts failed writes by sink.
	ExportErrors *prometheus.CounterVec
	// ExportDropped counts rows given up on after retries, by sink.
	ExportDropped *prometheus.CounterVec
	// ExportDuration is the time a sink took to write one batch.
	ExportDuration *prometheus.HistogramVec
}

// latencyBuckets spans 100 µs to ~100 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 16)

// New creates and registers every collector on a fresh registry, together
// with the Go runtime and process collectors.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_requests_total", Help: "Proxied requests by model, backend, endpoint and HTTP status returned to the client.",
		}, []string{"model", "backend", "endpoint", "status"}),
		CallsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_calls_rejected_total", Help: "Agent calls refused before they were admitted (not proxied, not captured, no sequence id), and requests to routes without a credential refused as cross-site or for their Host (host, cross_site, content_type), by reason.",
		}, []string{"reason"}),
		SequenceEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rollgate_sequence_evictions_total", Help: "Attempts moved out of the in-memory sequence table to keep it within its bounds (each reserves its next block of ids from the sequence store at its next call).",
		}),
		SequenceWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rollgate_sequence_waits_total", Help: "Admitted calls that waited for their block of sequence ids to be reserved in the database (an attempt's first call, or a used-up block): the reservation, begun at admission beside the engine's work, was not committed when the call needed its id.",
		}),
		TokenIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_token_in_calls_total", Help: "Chat calls under token-in mode by outcome: extended (previous prompt + response ids + the new messages), first, whole:REASON (rendered whole), passthrough:REASON (the engine rendered the text).",
		}, []string{"outcome"}),
		TokenInResumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_token_in_resumes_total", Help: "Token-in generations interrupted by a pause in mode abort, by outcome: aborted (the engine stopped it), resumed (the rest generated by the replica serving after the resume), finished (max_tokens reached before the abort took effect), failed (not continued: the client got an error naming the response token).",
		}, []string{"outcome"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_retries_total", Help: "Calls with a client retry signal (x-stainless-retry-count > 0 or an Idempotency-Key) by outcome: matched (an earlier try of the same attempt was found; the retry kept its sequence id, retry_count and retry_of say which try it is) or unmatched (none found: the body differs, another attempt, or forgotten; stored as a new call).",
		}, []string{"outcome"}),
		TokenInEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rollgate_token_in_evictions_total", Help: "Attempts whose last call token-in mode forgot to stay within --token-in-max-attempts and --token-in-max-bytes (their next call is rendered whole).",
		}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rollgate_request_duration_seconds", Help: "Time from request arrival to the last response byte.", Buckets: latencyBuckets,
		}, []string{"model", "endpoint", "stream"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rollgate_time_to_first_token_seconds", Help: "Time from request arrival to the first streamed event sent to the client.", Buckets: latencyBuckets,
		}, []string{"model", "endpoint"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_tokens_total", Help: "Tokens by model and kind (prompt, completion), from the engine's usage.",
		}, []string{"model", "kind"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rollgate_in_flight_requests", Help: "Requests being proxied right now.",
		}),
		BackendInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rollgate_backend_in_flight_requests", Help: "Outstanding requests per backend replica.",
		}, []string{"backend"}),
		RoutingAffinity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_routing_affinity_total", Help: "Replica selections of rollout-affine pools by outcome: hit (the rollout's own replica), spill (the next replica of its rendezvous order: its own was unhealthy, over the load bound or already tried by the call), fallback (no rollout id, or no healthy replica: least outstanding).",
		}, []string{"outcome"}),
		CaptureQueueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rollgate_capture_queue_depth", Help: "Calls waiting in the capture queue.",
		}),
		CaptureQueueCapacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rollgate_capture_queue_capacity", Help: "Capacity of the capture queue (see --capture-queue).",
		}),
		CaptureDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rollgate_capture_dropped_total", Help: "Calls not captured because the capture queue was full.",
		}),
		CapturedRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rollgate_captured_rows_total", Help: "llm_calls rows produced by capture.",
		}),
		TokenIDs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_token_ids_total", Help: "Captured rows by token_source: engine (verified), engine_mismatch (counts differ from usage), none (missing).",
		}, []string{"source"}),
		TokenFallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_token_fallback_total", Help: "Calls whose missing or miscounted token ids were completed from the backend's /tokenize or from logprobs, by result.",
		}, []string{"result"}),
		Detok: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_detok_total", Help: "Captured rows whose output ids were decoded and compared with the returned text, by outcome.",
		}, []string{"outcome"}),
		Redactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_redactions_total", Help: "Captured rows whose stored text a redaction rule changed, by rule.",
		}, []string{"rule"}),
		AgentSpans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_agent_spans_total", Help: "Agent spans received over OTLP (POST /v1/traces), by attribution to a rollout and result.",
		}, []string{"attributed", "result"}),
		Turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_turns_total", Help: "Calls of rollouts by how their prompt ids continue the previous call's prompt + response (turn_kind).",
		}, []string{"kind"}),
		ExportBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_export_batches_total", Help: "Batches written to a sink, by result.",
		}, []string{"sink", "result"}),
		ExportRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_export_rows_total", Help: "Rows written to a sink, by table.",
		}, []string{"sink", "table"}),
		ExportErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_export_errors_total", Help: "Failed batch writes, by sink.",
		}, []string{"sink"}),
		ExportDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rollgate_export_dropped_rows_total", Help: "Rows given up on after the export retries were exhausted, by sink.",
		}, []string{"sink"}),
		ExportDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rollgate_export_batch_duration_seconds", Help: "Time a sink took to store one batch.", Buckets: latencyBuckets,
		}, []string{"sink"}),
	}
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.Requests, m.CallsRejected, m.SequenceEvictions, m.SequenceWaits, m.TokenIn, m.TokenInResumes, m.Retries, m.TokenInEvictions, m.RequestDuration, m.TTFT, m.Tokens, m.InFlight, m.BackendInFlight, m.RoutingAffinity,
		m.CaptureQueueDepth, m.CaptureQueueCapacity, m.CaptureDropped, m.CapturedRows, m.TokenIDs, m.TokenFallback, m.Detok, m.Redactions, m.AgentSpans, m.Turns,
		m.ExportBatches, m.ExportRows, m.ExportErrors, m.ExportDropped, m.ExportDuration,
	)
	return m
}

// ModelLabel makes a client-supplied model name safe as a label value:
// "invalid" when it is not valid UTF-8 or longer than 128 bytes (the
// Prometheus client panics on invalid UTF-8).
func ModelLabel(model string) string {
	if len(model) > 128 || !utf8.ValidString(model) {
		return "invalid"
	}
	return model
}
