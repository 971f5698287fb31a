// Package capture turns the calls the gateway proxies into stored rows, off
// the agent's hot path: one llm_calls row per choice of each call, with the
// exact token ids, logprobs and usage, checked and (when the engine did not
// return them) completed before they reach the stores of package export.
//
// # Flow
//
//	gateway ──Pending──▶ WAL (optional) ──▶ queue ──▶ workers: Assembler → Rows
//	        → id fallback, checks, redaction ──▶ batcher ──▶ sinks (spool in front)
//
// Step by step:
//
//   - The gateway fills a Pending per call (AcquirePending): the request, the
//     attribution and timings in Meta, the Endpoint, and the response, either
//     the body of a non-streamed call or, for a stream, each SSE event's data
//     as it arrives (Pending.AddEvent; SSEScanner splits the stream). A
//     stream is assembled event by event as it passes, so its payloads are
//     not kept, except those that may carry logprobs, for the id fallback.
//   - With a WAL (Config.WAL, wal.go) the finished call's raw record is
//     handed to the kernel with one write(2) before its answer completes
//     (Pipeline.Commit, or TryPush for a non-streamed call); the records a
//     killed process never acknowledged are replayed at start
//     (Pipeline.ReplayWAL). walcodec.go is the record format.
//   - Pipeline.TryPush queues the call without blocking; a full queue
//     (Config.QueueSize, Config.QueueBytes) returns false and the call is
//     counted as dropped.
//   - Workers take queued calls in bulk. The Assembler reads one response,
//     streamed or not, for any endpoint (openai.Endpoint; unknown routes are
//     guessed from the "object" field) into per-choice results; Rows turns
//     them into export.Call rows and checks the token ids against usage
//     (token_source, token_check). Calls whose ids are missing or failed go
//     through the backend's IDFiller (Config.Fallback, implemented by
//     tokenize/fallback); then come the detokenisation check (SetDetok), the
//     turn-continuity check (tokenize.Tracker) and redaction (Redactor).
//   - The batcher writes rows to every sink (NamedSink) when a batch reaches
//     Config.BatchSize rows or Config.BatchBytes, or after
//     Config.FlushInterval, retrying with backoff. A sink wrapped in
//     capture/spool survives store outages: batches wait on local disk and
//     are replayed in order. Once a call's rows are in every sink (or
//     dropped and counted) its WAL record is acknowledged and Pipeline.Sync
//     waiters wake.
//
// # Files
//
// pipeline.go holds Pending, Config and the Pipeline (queue, workers, batcher,
// Sync); walpipe.go connects the Pipeline to the WAL. The Assembler spans
// assemble.go (its state, Reset, SetBody, AddChunk and Result),
// assemble_choice.go (per-choice state, streamed chunks merged into it),
// assemble_build.go (non-streamed bodies; messages and the assembled body)
// and jsonwalk.go (the raw JSON walkers and value readers, over
// internal/jsonscan, whose Index lets a stream chunk's nested walks share
// one scan of it). assemble_fast.go reads the regular chunks of chat and
// completions streams in one pass (validating them as it stages the values
// it needs) and leaves every other chunk to that general path. rows.go,
// redact.go and sse.go hold Rows, the Redactor and the SSEScanner.
//
// On the gateway's hot path run only Pending.AddEvent (the Assembler, one
// event at a time), the SSEScanner and the WAL write; the rest runs in the
// pipeline's goroutines.
package capture
