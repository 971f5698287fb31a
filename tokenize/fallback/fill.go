package fallback

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize"
)

// Fill completes the token ids of one captured call. rows are the call's
// llm_calls rows as capture.Rows built them (one per choice, token_source and
// token_check already set by tokenize.Verify); request is the request body
// as the client sent it; payloads calls its argument with the non-streamed
// response body, or with every SSE data payload in order.
//
// Rows whose engine ids were verified, and failed calls, are left alone.
// Otherwise, prompt ids are fetched from the backend when the engine's were
// missing or miscounted, and output ids are read from logprobs when the
// engine's were missing or miscounted and every logprob entry carries an id.
// The completed rows are checked again against usage with tokenize.Verify;
// only when that passes (or only usage is missing) are they updated, with
// token_source "tokenize" and token_check kept as the engine's failed checks
// (empty when the engine sent no ids), so the reason stays visible. On any
// failure the rows are unchanged and the error says why.
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
	var out tokenize.FillOutcome
	if needPrompt {
		ids, err := c.PromptIDs(ctx, rows[0].Endpoint, request)
		if err != nil {
			return out, fmt.Errorf("fallback: prompt ids: %w", err)
		}
		for i := range rows {
			p := 0
			if len(ids) > 1 {
				p = int(rows[i].ChoiceIndex) / n
			}
			if p >= len(ids) {
				return out, fmt.Errorf("fallback: choice %d has no prompt among %d", rows[i].ChoiceIndex, len(ids))
			}
			prompts[i] = ids[p]
		}
		out.Prompt = true
	}
	if needOutput {
		var lp LogprobIDs
		payloads(lp.Add)
		for i := range rows {
			ids, ok := lp.IDs(rows[i].ChoiceIndex)
			if !ok {
				return tokenize.FillOutcome{}, fmt.Errorf("fallback: choice %d: no logprobs with token ids "+
					"(request return_tokens_as_token_ids on vLLM, logprobs on llama.cpp)", rows[i].ChoiceIndex)
			}
			outputs[i] = ids
		}
		out.Output = true
	}

	tc := tokenize.Call{
		PromptTokens:     rows[0].PromptTokens,
		CompletionTokens: rows[0].CompletionTokens,
		HasUsage:         rows[0].PromptTokens > 0 || rows[0].CompletionTokens > 0,
		Endpoint:         rows[0].Endpoint,
		N:                n,
	}
	chat := strings.Contains(rows[0].Endpoint, "chat")
	for i := range rows {
		ch := tokenize.Choice{TokenIDs: outputs[i], HasTokenIDs: true, Logprobs: -1}
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
	if len(failed) > 0 {
		return tokenize.FillOutcome{Failed: v.Failed}, fmt.Errorf("fallback: ids still fail %s", strings.Join(v.Failed, ","))
	}
	if none {
		check = ""
	}
	if !tc.HasUsage && !hasCheck(check, tokenize.CheckUsageMissing) {
		check = joinCheck(check, tokenize.CheckUsageMissing)
	}
	for i := range rows {
		rows[i].PromptTokenIDs = slices.Clone(prompts[i])
		rows[i].ResponseTokenIDs = slices.Clone(outputs[i])
		rows[i].TokenSource = export.TokenSourceTokenize
		rows[i].TokenCheck = check
	}
	return out, nil
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
