package fallback

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize"
)

// Fill completes the token ids of one captured call. rows are the call's
// llm_calls rows as capture.Rows built them (one per choice, token_source,
// token_check and the per-side sources already set by tokenize.Verify and
// tokenize.Sides); request is the request body as the client sent it;
// payloads calls its argument with the non-streamed response body, or with
// every SSE data payload in order.
//
// Rows whose engine ids were verified, and failed calls, are left alone.
// Otherwise each side is completed on its own: prompt ids are fetched from
// the backend when the engine's were missing or miscounted, and output ids
// are read from logprobs when the engine's were missing or miscounted and
// every logprob entry carries an id. The ids are checked against usage
// with tokenize.Verify; a side is written into the rows only when its own
// checks pass (or only usage is missing), with its source (prompt or
// response_token_source) "tokenize". token_source becomes "tokenize" when
// both sides then hold verified ids, with token_check kept as the engine's
// failed checks (empty when the engine sent no ids), so the reason stays
// visible; when only one side could be completed token_source is left as
// it was and token_check lists the checks the other side still fails
// (llama.cpp leaves some sampled tokens out of its logprobs: the prompt
// ids are kept all the same). The error says what could not be completed;
// the outcome says what was written.
func (c *Client) Fill(ctx context.Context, rows []export.Call, request []byte, payloads func(func(data []byte))) (tokenize.FillOutcome, error) {
	if len(rows) == 0 || rows[0].TokenSource == export.TokenSourceEngine ||
		rows[0].Error != "" || rows[0].HTTPStatus >= 400 {
		return tokenize.FillOutcome{Skipped: true}, nil
	}
	f := filling{rows: rows, check: rows[0].TokenCheck}
	f.none = rows[0].TokenSource == export.TokenSourceNone || rows[0].TokenSource == ""
	f.needPrompt = f.none || hasCheck(f.check, tokenize.CheckPromptMissing, tokenize.CheckPromptCount)
	f.needOutput = f.none || hasCheck(f.check, tokenize.CheckCompletionMissing, tokenize.CheckCompletionCount, tokenize.CheckLogprobsCount)
	if !f.needPrompt && !f.needOutput {
		// Only usage_missing: the engine's ids cannot be improved upon.
		return tokenize.FillOutcome{Skipped: true}, nil
	}
	f.n = 1
	if v := gjson.GetBytes(request, "n"); v.Type == gjson.Number && v.Int() > 1 {
		f.n = int(v.Int())
	}
	f.prompts = make([][]uint32, len(rows))
	f.outputs = make([][]uint32, len(rows))
	for i := range rows {
		f.prompts[i], f.outputs[i] = rows[i].PromptTokenIDs, rows[i].ResponseTokenIDs
	}
	if f.needPrompt {
		if err := c.fillPrompts(ctx, rows, request, f.n, f.prompts); err != nil {
			f.errs = append(f.errs, "prompt ids: "+err.Error())
		} else {
			f.gotPrompt = true
		}
	}
	if f.needOutput {
		f.readOutputs(payloads)
	}
	out := f.verify()
	f.write(out)
	if len(f.errs) > 0 {
		return out, errors.New("fallback: " + strings.Join(f.errs, "; "))
	}
	return out, nil
}

// filling is Fill's work on one call: what each side needs, the ids
// obtained, and what could not be completed.
type filling struct {
	rows                   []export.Call
	n                      int    // the request's n
	check                  string // the rows' token_check
	none                   bool   // the engine sent no ids
	needPrompt, needOutput bool
	prompts, outputs       [][]uint32 // per row: the engine's ids, replaced by those obtained
	gotPrompt, gotOutput   bool
	hasUsage               bool     // the rows hold usage counts
	failed                 []string // the checks that still fail, usage_missing left out
	errs                   []string
}

// readOutputs reads every choice's output ids from the logprobs of the
// payloads; when a choice has none, every row keeps the engine's.
func (f *filling) readOutputs(payloads func(func(data []byte))) {
	var lp LogprobIDs
	payloads(lp.Add)
	f.gotOutput = true
	for i := range f.rows {
		ids, ok := lp.IDs(f.rows[i].ChoiceIndex)
		if !ok {
			f.errs = append(f.errs, fmt.Sprintf("choice %d: no logprobs with token ids "+
				"(request return_tokens_as_token_ids on vLLM, logprobs on llama.cpp)", f.rows[i].ChoiceIndex))
			f.gotOutput = false
			break
		}
		f.outputs[i] = ids
	}
	if !f.gotOutput {
		for i := range f.rows {
			f.outputs[i] = f.rows[i].ResponseTokenIDs
		}
	}
}

// verify checks the ids obtained against usage (tokenize.Verify), each side
// on its own, and says which side may be written.
func (f *filling) verify() tokenize.FillOutcome {
	rows := f.rows
	tc := tokenize.Call{
		PromptTokens:     rows[0].PromptTokens,
		CompletionTokens: rows[0].CompletionTokens,
		HasUsage:         rows[0].PromptTokens > 0 || rows[0].CompletionTokens > 0,
		Endpoint:         rows[0].Endpoint,
		N:                f.n,
	}
	f.hasUsage = tc.HasUsage
	chat := openai.ChatShaped(rows[0].Endpoint)
	for i := range rows {
		ch := tokenize.Choice{TokenIDs: f.outputs[i], HasTokenIDs: f.gotOutput || !f.needOutput, Logprobs: -1}
		if lps := len(rows[i].ResponseLogprobs); lps > 0 {
			ch.Logprobs = lps
		}
		if !chat {
			ch.PromptTokenIDs = f.prompts[i]
		}
		tc.Choices = append(tc.Choices, ch)
	}
	if chat {
		tc.PromptTokenIDs = f.prompts[0]
	}
	v := tokenize.Verify(&tc)
	f.failed = slices.DeleteFunc(slices.Clone(v.Failed), func(s string) bool { return s == tokenize.CheckUsageMissing })
	promptOK := f.gotPrompt && !slices.ContainsFunc(f.failed, isPromptCheck)
	outputOK := f.gotOutput && !slices.ContainsFunc(f.failed, isOutputCheck)
	if f.gotPrompt && !promptOK {
		f.errs = append(f.errs, "prompt ids fail "+strings.Join(filter(f.failed, isPromptCheck), ","))
	}
	if f.gotOutput && !outputOK {
		f.errs = append(f.errs, "output ids fail "+strings.Join(filter(f.failed, isOutputCheck), ","))
	}
	out := tokenize.FillOutcome{Prompt: promptOK, Output: outputOK}
	if len(f.errs) > 0 {
		out.Failed = f.failed
	}
	return out
}

// write writes the verified sides into the rows, with their sources, and
// the rows' token_check and token_source (see Fill).
func (f *filling) write(out tokenize.FillOutcome) {
	check := f.check
	promptDone := out.Prompt || !f.needPrompt
	outputDone := out.Output || !f.needOutput
	if promptDone && outputDone {
		if f.none {
			check = ""
		}
		if !f.hasUsage && !hasCheck(check, tokenize.CheckUsageMissing) {
			check = joinCheck(check, tokenize.CheckUsageMissing)
		}
	} else if out.Prompt || out.Output {
		check = strings.Join(f.failed, ",")
	}
	for i := range f.rows {
		row := &f.rows[i]
		if out.Prompt {
			row.PromptTokenIDs = slices.Clone(f.prompts[i])
			row.PromptTokenSource = export.TokenSourceTokenize
		}
		if out.Output {
			row.ResponseTokenIDs = slices.Clone(f.outputs[i])
			row.ResponseTokenSource = export.TokenSourceTokenize
		}
		if out.Prompt || out.Output {
			row.TokenCheck = check
		}
		if promptDone && outputDone {
			row.TokenSource = export.TokenSourceTokenize
		}
	}
}

// fillPrompts fetches the prompt ids of the call into prompts (one per row).
func (c *Client) fillPrompts(ctx context.Context, rows []export.Call, request []byte, n int, prompts [][]uint32) error {
	ids, err := c.PromptIDs(ctx, rows[0].Endpoint, request)
	if err != nil {
		return err
	}
	for i := range rows {
		p := 0
		if len(ids) > 1 {
			p = int(rows[i].ChoiceIndex) / n
		}
		if p >= len(ids) {
			return fmt.Errorf("choice %d has no prompt among %d", rows[i].ChoiceIndex, len(ids))
		}
		prompts[i] = ids[p]
	}
	return nil
}

func isPromptCheck(s string) bool {
	return s == tokenize.CheckPromptMissing || s == tokenize.CheckPromptCount
}

func isOutputCheck(s string) bool {
	return s == tokenize.CheckCompletionMissing || s == tokenize.CheckCompletionCount || s == tokenize.CheckLogprobsCount
}

// filter returns the elements of list that keep accepts.
func filter(list []string, keep func(string) bool) []string {
	var out []string
	for _, s := range list {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// hasCheck reports whether the comma-separated list holds any of names.
func hasCheck(list string, names ...string) bool {
	for _, s := range strings.Split(list, ",") {
		if slices.Contains(names, s) {
			return true
		}
	}
	return false
}

func joinCheck(list, name string) string {
	if list == "" {
		return name
	}
	return list + "," + name
}
