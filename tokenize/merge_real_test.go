package tokenize_test

import (
	"encoding/json"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// TestTurnsMergeWithRealTemplates: two consecutive agent turns with the real chat
// templates and tokenizers of Qwen2.5, Qwen3 and Llama-3. The first turn's
// response ids are what an engine returns: the sampled ids of the answer followed
// by the end-of-turn token that ended it (vLLM's token_ids include it, as do
// llama.cpp's non-streamed logprobs; docs/engines.md). The second prompt is what
// the engine renders from the conversation with the answer appended. Every case
// says how the turns relate (tokenize.CompareTurn), and why when they do not merge.
func TestTurnsMergeWithRealTemplates(t *testing.T) {
	const user1, user2 = `{"role":"user","content":"What is the capital of France?"}`, `{"role":"user","content":"And of Italy?"}`
	const system = `{"role":"system","content":"You are terse."}`
	type turnCase struct {
		name    string
		model   string
		kwargs  string // chat_template_kwargs of both requests
		answer  string // the assistant message the engine returned (JSON)
		sampled string // the text the model sampled ("" = the answer's content)
		eos     bool   // the response ids end on the end-of-turn token
		noIDs   bool   // the response has no ids at all (a llama.cpp chat stream)
		split   bool   // the sampled ids split the answer's first token in two
		want    string
	}
	plain := `{"role":"assistant","content":"Paris."}`
	cases := []turnCase{}
	for _, m := range []string{"qwen2_5", "qwen3", "llama3"} {
		kw, merge := "", tokenize.TurnPrefix
		if m == "qwen3" {
			// Qwen3 without thinking: the open turn's generation prompt ends
			// with an empty "<think>\n\n</think>\n\n" that the rendered
			// history does not repeat: a template break at the boundary.
			kw, merge = `{"enable_thinking":false}`, tokenize.TurnTemplate
		}
		cases = append(cases,
			// The answer ended on its end-of-turn token: the next prompt
			// continues prompt + response ids exactly.
			turnCase{name: "eos", model: m, kwargs: kw, answer: plain, eos: true, want: merge},
			// Cut by max_tokens (no end-of-turn token sampled): the template
			// writes one after the response, so the turns still merge (the
			// token then sits in the next prompt, not in the response).
			turnCase{name: "length", model: m, kwargs: kw, answer: plain, want: merge},
			// No response ids (llama.cpp chat streams lose the end-of-turn
			// token's logprob, so the output side is not stored).
			turnCase{name: "no-response-ids", model: m, kwargs: kw, answer: plain, eos: true, noIDs: true, want: tokenize.TurnNoIDs},
			// The model sampled a non-canonical split of the same text: the
			// template's re-encoding differs inside the response.
			// (Qwen3 with thinking on, so the boundary break does not come first.)
			turnCase{name: "non-canonical-sampling", model: m, kwargs: thinking(m, kw), answer: `{"role":"assistant","content":"Parisian."}`, eos: true, split: true, want: tokenize.TurnRetokenized},
		)
	}
	// Qwen3 with thinking: the model samples its reasoning, the template drops the
	// reasoning of turns before the last user message when it renders history.
	cases = append(cases, turnCase{name: "thinking-dropped", model: "qwen3", kwargs: `{"enable_thinking":true}`,
		answer: `{"role":"assistant","content":"Paris."}`, sampled: "<think>\nEasy.\n</think>\n\nParis.", eos: true, want: tokenize.TurnEdited})
	// Qwen3 with thinking and no think block sent back: the same answer merges.
	cases = append(cases, turnCase{name: "thinking-eos", model: "qwen3", kwargs: `{"enable_thinking":true}`,
		answer: plain, eos: true, want: tokenize.TurnPrefix})

	for _, c := range cases {
		t.Run(c.model+"/"+c.name, func(t *testing.T) {
			r, err := chattemplate.LoadDir(chattemplatetest.ModelDir(t, c.model))
			if err != nil {
				t.Fatal(err)
			}
			tok := r.Tokenizer
			render := func(msgs string, gen bool) []uint32 {
				t.Helper()
				in := chattemplate.Input{Messages: json.RawMessage(msgs), AddGenerationPrompt: gen}
				if c.kwargs != "" {
					in.Kwargs = json.RawMessage(c.kwargs)
				}
				s, err := r.Template.Render(in)
				if err != nil {
					t.Fatal(err)
				}
				return tok.Encode(s)
			}
			eot := map[string]string{"qwen2_5": "<|im_end|>", "qwen3": "<|im_end|>", "llama3": "<|eot_id|>"}[c.model]
			eotID, ok := tok.AddedID(eot)
			if !ok {
				t.Fatalf("no %s in the vocabulary", eot)
			}
			var answer struct{ Content string }
			if err := json.Unmarshal([]byte(c.answer), &answer); err != nil {
				t.Fatal(err)
			}
			sampled := c.sampled
			if sampled == "" {
				sampled = answer.Content
			}
			resp := tok.Encode(sampled)
			if c.split {
				resp = splitFirst(t, tok, resp)
			}
			if c.eos {
				resp = append(resp, eotID)
			}
			respSource := export.TokenSourceEngine
			if c.noIDs {
				resp, respSource = nil, export.TokenSourceNone
			}
			prev := export.Call{RolloutID: "r", AttemptID: "a", SequenceID: 1, HTTPStatus: 200,
				PromptTokenIDs: render("["+system+","+user1+"]", true), ResponseTokenIDs: resp, TokenSource: export.TokenSourceEngine,
				ResponseTokenSource: respSource}
			cur := export.Call{RolloutID: "r", AttemptID: "a", SequenceID: 2, HTTPStatus: 200,
				PromptTokenIDs: render("["+system+","+user1+","+c.answer+","+user2+"]", true), TokenSource: export.TokenSourceEngine}
			turn := tokenize.CompareTurn([]export.Call{prev}, []export.Call{cur}, &tokenize.TurnOptions{Special: tok.IsSpecial, Decode: tok.Decode})
			if turn.Kind != c.want {
				t.Fatalf("turn %s (prefix %d of %d+%d), want %s", turn.Kind, turn.PrefixLen, len(prev.PromptTokenIDs), len(resp), c.want)
			}
			if c.want == tokenize.TurnPrefix && turn.PrefixLen != len(prev.PromptTokenIDs)+len(resp) {
				t.Fatalf("prefix length %d, want %d", turn.PrefixLen, len(prev.PromptTokenIDs)+len(resp))
			}
		})
	}
}

// thinking turns Qwen3's thinking on (its template then opens the assistant turn
// as the history renders it); other models keep kw.
func thinking(model, kw string) string {
	if model == "qwen3" {
		return `{"enable_thinking":true}`
	}
	return kw
}

// splitFirst replaces the first id of ids by two ids that decode to the same text,
// as a sampler may produce (the canonical encoding never does).
func splitFirst(t *testing.T, tok interface {
	Decode([]uint32) (string, error)
	Encode(string) []uint32
}, ids []uint32) []uint32 {
	t.Helper()
	text, err := tok.Decode(ids[:1])
	if err != nil || len(text) < 2 {
		t.Fatalf("first token %q: %v", text, err)
	}
	for k := 1; k < len(text); k++ {
		a, b := tok.Encode(text[:k]), tok.Encode(text[k:])
		if len(a) == 1 && len(b) == 1 {
			return append([]uint32{a[0], b[0]}, ids[1:]...)
		}
	}
	t.Fatalf("cannot split %q into two tokens", text)
	return nil
}
