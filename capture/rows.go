package capture

import (
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize"
)

// Rows assembles a completed call into llm_calls rows, one per choice (one
// row with choice_index 0 when the response has no choices, e.g. an error or
// an embedding). Token ids are checked against usage and the verdict is
// recorded in token_source and token_check. a is reused scratch space for a
// non-streamed response; a streamed one was assembled by Pending.AddEvent.
func Rows(p *Pending, a *Assembler) []export.Call {
	p.ResolveIDs()
	if p.Streamed() {
		a = &p.asm
	} else {
		a.Reset(p.Endpoint)
		if len(p.Body) > 0 {
			a.SetBody(p.Body)
		}
	}
	res := a.Result()

	base := p.Meta
	if !p.NoBodies {
		base.RequestBody = p.Request
		switch {
		case res.tooDeep: // not kept (Assembled.tooDeep); Error says why
		case res.body != "": // a string of its own already (Assembled.body)
			base.ResponseBody = res.body
		case p.Streamed():
			base.ResponseBody = string(res.ResponseBody)
		default:
			base.ResponseBody = string(p.Body)
		}
	}
	if base.Error == "" && res.Error != "" {
		base.Error = res.Error
	}
	if res.Usage.Present {
		base.PromptTokens = res.Usage.PromptTokens
		base.CompletionTokens = res.Usage.CompletionTokens
	}

	if p.N <= 0 {
		p.N = requestN(p.Request)
	}
	tc := tokenize.Call{
		PromptTokenIDs:   res.PromptTokenIDs,
		PromptTokens:     res.Usage.PromptTokens,
		CompletionTokens: res.Usage.CompletionTokens,
		HasUsage:         res.Usage.Present,
		Endpoint:         base.Endpoint,
		N:                p.N,
	}
	for i := range res.Choices {
		ch := &res.Choices[i]
		lp := -1
		if len(ch.Logprobs) > 0 {
			lp = len(ch.Logprobs)
		}
		tc.Choices = append(tc.Choices, tokenize.Choice{
			PromptTokenIDs: ch.PromptTokenIDs, TokenIDs: ch.TokenIDs,
			HasTokenIDs: ch.HasTokenIDs, Logprobs: lp,
		})
	}
	verdict := tokenize.Verify(&tc)
	base.TokenSource = verdict.Source
	base.TokenCheck = verdict.Check()
	base.PromptTokenSource, base.ResponseTokenSource = tokenize.Sides(&tc, verdict)

	if len(res.Choices) == 0 {
		base.PromptTokenIDs = slices.Clone(res.PromptTokenIDs)
		return []export.Call{base}
	}
	rows := make([]export.Call, len(res.Choices))
	for i := range res.Choices {
		ch := &res.Choices[i]
		r := base
		r.ChoiceIndex = ch.Index
		switch {
		case ch.msg == "":
			r.ResponseMessage = string(ch.Message)
		case p.NoBodies:
			// A substring of the body would keep the whole body, which the
			// row does not hold, alive with it.
			r.ResponseMessage = strings.Clone(ch.msg)
		default:
			r.ResponseMessage = ch.msg
		}
		if len(ch.PromptTokenIDs) > 0 {
			r.PromptTokenIDs = slices.Clone(ch.PromptTokenIDs)
		} else {
			r.PromptTokenIDs = slices.Clone(res.PromptTokenIDs)
		}
		r.ResponseTokenIDs = slices.Clone(ch.TokenIDs)
		r.ResponseLogprobs = slices.Clone(ch.Logprobs)
		r.FinishReason = ch.FinishReason
		rows[i] = r
	}
	return rows
}

// requestN is the request's "n" (1 when absent or invalid).
func requestN(req string) int {
	n := gjson.Get(req, "n")
	if n.Type != gjson.Number || n.Int() < 1 {
		return 1
	}
	return int(n.Int())
}
