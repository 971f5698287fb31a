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
	check := rows[0].TokenCheck
	none := rows[0].TokenSource == export.TokenSourceNone || rows[0].TokenSource == ""
	needPrompt := none || hasCheck(check, tokenize.CheckPromptMissing, tokenize.CheckPromptCount)
	needOutput := none || hasCheck(check, tokenize.CheckCompletionMissing, tokenize.CheckCompletionCount, tokenize.CheckLogprobsCount)
	if !needPrompt && !needOutput {
		// Only usage_missing: the engine's ids cannot be improved upon.
		return tokenize.FillOutcome{Skipped: true}, nil
	}
	n := 1
	if v := gjson.GetBytes(request, "n"); v.Type == gjson.Number && v.Int() > 1 {
		n = int(v.Int())
	}

	prompts := make([][]uint32, len(rows))
	outputs := make([][]uint32, len(rows))
	for i := range rows {
		prompts[i], outputs[i] = rows[i].PromptTokenIDs, rows[i].ResponseTokenIDs
	}
	var errs []string
	gotPrompt, gotOutput := false, false
	if needPrompt {
		if err := c.fillPrompts(ctx, rows, request, n, prompts); err != nil {
			errs = append(errs, "prompt ids: "+err.Error())
		} else {
			gotPrompt = true
		}
	}
	if needOutput {
		var lp LogprobIDs
		payloads(lp.Add)
		gotOutput = true
		for i := range rows {
			ids, ok := lp.IDs(rows[i].ChoiceIndex)
			if !ok {
				errs = append(errs, fmt.Sprintf("choice %d: no logprobs with token ids "+
					"(request return_tokens_as_token_ids on vLLM, logprobs on llama.cpp)", rows[i].ChoiceIndex))
				gotOutput = false
				break
			}
			outputs[i] = ids
		}
		if !gotOutput {
			for i := range rows {
				outputs[i] = rows[i].ResponseTokenIDs
			}
		}
	}

	// Check what was obtained, each side on its own.
	tc := tokenize.Call{
		PromptTokens:     rows[0].PromptTokens,
		CompletionTokens: rows[0].CompletionTokens,
		HasUsage:         rows[0].PromptTokens > 0 || rows[0].CompletionTokens > 0,
		Endpoint:         rows[0].Endpoint,
		N:                n,
	}
	chat := openai.ChatShaped(rows[0].Endpoint)
	for i := range rows {
		ch := tokenize.Choice{TokenIDs: outputs[i], HasTokenIDs: gotOutput || !needOutput, Logprobs: -1}
		if lps := len(rows[i].ResponseLogprobs); lps > 0 {
			ch.Logprobs = lps
		}
		if !chat {
			ch.PromptTokenIDs = prompts[i]
		}
		tc.Choices = append(tc.Choices, ch)
	}
	if chat {
		tc.PromptTokenIDs = prompts[0]
	}
	v := tokenize.Verify(&tc)
	failed := slices.DeleteFunc(slices.Clone(v.Failed), func(s string) bool { return s == tokenize.CheckUsageMissing })
	promptOK := gotPrompt && !slices.ContainsFunc(failed, isPromptCheck)
	outputOK := gotOutput && !slices.ContainsFunc(failed, isOutputCheck)
	if gotPrompt && !promptOK {
		errs = append(errs, "prompt ids fail "+strings.Join(filter(failed, isPromptCheck), ","))
	}
	if gotOutput && !outputOK {
		errs = append(errs, "output ids fail "+strings.Join(filter(failed, isOutputCheck), ","))
	}
	out := tokenize.FillOutcome{Prompt: promptOK, Output: outputOK}
	if len(errs) > 0 {
		out.Failed = failed
	}

	promptDone := promptOK || !needPrompt
	outputDone := outputOK || !needOutput
	if promptDone && outputDone {
		if none {
			check = ""
		}
		if !tc.HasUsage && !hasCheck(check, tokenize.CheckUsageMissing) {
			check = joinCheck(check, tokenize.CheckUsageMissing)
		}
	} else if promptOK || outputOK {
		check = strings.Join(failed, ",")
	}
	for i := range rows {
		if promptOK {
			rows[i].PromptTokenIDs = slices.Clone(prompts[i])
			rows[i].PromptTokenSource = export.TokenSourceTokenize
		}
		if outputOK {
			rows[i].ResponseTokenIDs = slices.Clone(outputs[i])
			rows[i].ResponseTokenSource = export.TokenSourceTokenize
		}
		if promptOK || outputOK {
			rows[i].TokenCheck = check
		}
		if promptDone && outputDone {
			rows[i].TokenSource = export.TokenSourceTokenize
		}
	}
	if len(errs) > 0 {
		return out, errors.New("fallback: " + strings.Join(errs, "; "))
	}
	return out, nil
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
