// Package tokenize decides where a captured call's token ids come from and
// whether the engine's ids can be trusted: ids returned by the engine are
// recorded as token_source "engine" only when their counts agree with the
// usage the engine reported; otherwise the call is marked "engine_mismatch"
// and the failed checks are listed (export.Call.TokenCheck).
//
// It also checks captured ids after the fact: CheckTurns / Tracker classify
// how each call's prompt ids continue the previous call of its rollout
// attempt (prefix, template, retokenized, edited), which tells the trainer
// bridge whether turns can be merged; CheckDetokenization decodes output ids
// and compares them with the returned text. Sub-packages: fallback (ids from
// a backend's /tokenize and from logprobs) and hf (local Hugging Face and
// tiktoken tokenizers).
package tokenize

import (
	"strings"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
)

// SourceMismatch is the token_source of a call whose ids came from the engine
// but failed a check (see Verdict.Failed). It extends the sources of package
// export.
const SourceMismatch = "engine_mismatch"

// Names of the checks Verify runs, as listed in Verdict.Failed.
const (
	CheckPromptMissing     = "prompt_missing"     // completion ids but no prompt ids
	CheckCompletionMissing = "completion_missing" // prompt ids but a choice without completion ids
	CheckPromptCount       = "prompt_count"       // prompt ids length != usage.prompt_tokens
	CheckCompletionCount   = "completion_count"   // sum of completion ids lengths != usage.completion_tokens
	CheckLogprobsCount     = "logprobs_count"     // a choice's logprobs count != its ids count
	CheckUsageMissing      = "usage_missing"      // no usage: the counts cannot be verified
)

// Choice is what a response carried for one choice. Choices[i] of a Call is
// the choice with index i.
type Choice struct {
	// PromptTokenIDs are per-choice prompt ids (completions, SGLang); nil when
	// the engine sent them at the top level or not at all.
	PromptTokenIDs []uint32
	// TokenIDs are the generated ids (for streams, the concatenation of every
	// chunk's token_ids).
	TokenIDs []uint32
	// HasTokenIDs is true when the engine sent token_ids for this choice (an
	// empty list counts: zero tokens generated).
	HasTokenIDs bool
	// Logprobs is the number of logprob entries received, -1 when the
	// response had no logprobs.
	Logprobs int
}

// Call is one request's ids and usage, as parsed from the engine's response.
type Call struct {
	// PromptTokenIDs are top-level prompt ids (vLLM chat); nil when absent.
	PromptTokenIDs []uint32
	// Choices, in choice index order.
	Choices []Choice
	// PromptTokens and CompletionTokens are usage as reported; HasUsage is
	// false when the response had no usage.
	PromptTokens, CompletionTokens uint32
	HasUsage                       bool
	// Endpoint is the route ("/v1/chat/completions", "/v1/completions"). A
	// chat request has one prompt; a completions request may have several.
	Endpoint string
	// N is the request's "n" (0 is read as 1). With several prompts, choices
	// i*N .. i*N+N-1 share prompt i, and usage.prompt_tokens counts each
	// prompt once.
	N int
}

// Verdict is the outcome of Verify.
type Verdict struct {
	// Source is export.TokenSourceEngine, export.TokenSourceNone or
	// SourceMismatch.
	Source string
	// Failed lists the failed checks (Check* names) in a fixed order; nil
	// when every check passed or there were no ids.
	Failed []string
}

// Check is the comma-separated list of failed checks, for export.Call.TokenCheck
// ("" when none failed).
func (v Verdict) Check() string { return strings.Join(v.Failed, ",") }

// OK reports whether the ids are the engine's and passed every check.
func (v Verdict) OK() bool { return v.Source == export.TokenSourceEngine }

// Verify checks the engine's token ids of one call against its usage:
//   - no ids anywhere: Source none;
//   - prompt ids present (top-level, or per choice for every choice starting a
//     prompt) and completion ids present for every choice, else
//     prompt_missing / completion_missing;
//   - len(prompt ids) == usage.prompt_tokens, where a completions request
//     counts each distinct prompt (choices i with i % N == 0) and a chat
//     request its single prompt (prompt_count);
//   - the sum of completion ids lengths == usage.completion_tokens
//     (completion_count);
//   - per choice with logprobs, as many logprobs as ids (logprobs_count);
//   - without usage the counts cannot be checked (usage_missing).
//
// Source is engine when ids are present and every check passed, otherwise
// engine_mismatch.
func Verify(c *Call) Verdict {
	if !hasIDs(c) {
		return Verdict{Source: export.TokenSourceNone}
	}
	n := c.N
	if n < 1 {
		n = 1
	}
	chat := openai.ChatShaped(c.Endpoint)

	// Prompt: top-level ids, else per-choice ids of each choice starting a prompt.
	promptMissing := false
	promptLen := 0
	switch {
	case len(c.PromptTokenIDs) > 0:
		promptLen = len(c.PromptTokenIDs)
	case chat:
		// One prompt: every choice repeats it; count it once.
		if len(c.Choices) == 0 || len(c.Choices[0].PromptTokenIDs) == 0 {
			promptMissing = true
		} else {
			promptLen = len(c.Choices[0].PromptTokenIDs)
		}
	default:
		if len(c.Choices) == 0 {
			promptMissing = true
		}
		for i := 0; i < len(c.Choices); i += n {
			if len(c.Choices[i].PromptTokenIDs) == 0 {
				promptMissing = true
				break
			}
			promptLen += len(c.Choices[i].PromptTokenIDs)
		}
	}

	completionMissing := len(c.Choices) == 0
	completionLen := 0
	logprobsBad := false
	for i := range c.Choices {
		ch := &c.Choices[i]
		if !ch.HasTokenIDs {
			completionMissing = true
			continue
		}
		completionLen += len(ch.TokenIDs)
		if ch.Logprobs >= 0 && ch.Logprobs != len(ch.TokenIDs) {
			logprobsBad = true
		}
	}

	var failed []string
	if promptMissing {
		failed = append(failed, CheckPromptMissing)
	}
	if completionMissing {
		failed = append(failed, CheckCompletionMissing)
	}
	if c.HasUsage {
		if !promptMissing && uint64(promptLen) != uint64(c.PromptTokens) {
			failed = append(failed, CheckPromptCount)
		}
		if !completionMissing && uint64(completionLen) != uint64(c.CompletionTokens) {
			failed = append(failed, CheckCompletionCount)
		}
	}
	if logprobsBad {
		failed = append(failed, CheckLogprobsCount)
	}
	if !c.HasUsage {
		failed = append(failed, CheckUsageMissing)
	}
	if len(failed) > 0 {
		return Verdict{Source: SourceMismatch, Failed: failed}
	}
	return Verdict{Source: export.TokenSourceEngine}
}

// Sides says where each side's ids stand after Verify, for
// export.Call.PromptTokenSource and ResponseTokenSource: "engine" when the
// side's ids are present and passed its checks (prompt_count;
// completion_count and logprobs_count), SourceMismatch when they are
// present but failed one (or usage was missing, so they could not be
// checked), export.TokenSourceNone when the side has no ids.
func Sides(c *Call, v Verdict) (prompt, response string) {
	prompt, response = export.TokenSourceNone, export.TokenSourceNone
	if v.Source == export.TokenSourceNone {
		return prompt, response
	}
	noUsage := hasFailed(v, CheckUsageMissing)
	if !hasFailed(v, CheckPromptMissing) {
		prompt = export.TokenSourceEngine
		if noUsage || hasFailed(v, CheckPromptCount) {
			prompt = SourceMismatch
		}
	}
	if !hasFailed(v, CheckCompletionMissing) {
		response = export.TokenSourceEngine
		if noUsage || hasFailed(v, CheckCompletionCount, CheckLogprobsCount) {
			response = SourceMismatch
		}
	}
	return prompt, response
}

// hasFailed reports whether v failed any of the named checks.
func hasFailed(v Verdict, names ...string) bool {
	for _, f := range v.Failed {
		for _, n := range names {
			if f == n {
				return true
			}
		}
	}
	return false
}

// hasIDs reports whether the engine sent any ids at all.
func hasIDs(c *Call) bool {
	if len(c.PromptTokenIDs) > 0 {
		return true
	}
	for i := range c.Choices {
		if c.Choices[i].HasTokenIDs || len(c.Choices[i].PromptTokenIDs) > 0 {
			return true
		}
	}
	return false
}
