// Package rewrite edits OpenAI-compatible request bodies on their way to an
// inference engine (injecting the fields that make the engine return exact
// token ids, logprobs and usage) and strips those injected fields from the
// engine's responses, so that the agent receives byte for byte what the engine
// would have sent for its original request.
//
// Everything here works on raw bytes: a single scan of the body, edits spliced
// into a caller-provided buffer, no allocations on the hot path.
package rewrite
