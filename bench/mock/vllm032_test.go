package mock

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// The vllm flavour's answers as vLLM 0.32.0 writes them (docs/engines.md,
// "Checked against a real vLLM"; TestMockMatchesRealVLLM compares them with
// the real engine). These tests pin them without one.

// TestVLLMToolChoiceFinish: a named tool_choice finishes with "stop" and
// content "", "required" with "tool_calls" and content "", streamed or not
// (chat_completion/serving.py).
func TestVLLMToolChoiceFinish(t *testing.T) {
	_, base := startT(t, Config{EndOfTurn: true})
	for _, tc := range []struct{ choice, finish string }{
		{`{"type":"function","function":{"name":"get_weather"}}`, "stop"},
		{`"required"`, "tool_calls"},
	} {
		body := strings.Replace(toolsReq, `"messages"`, `"tool_choice":`+tc.choice+`,"messages"`, 1)
		j := mustOK(t, post(t, base+"/chat/completions", body))
		c := j.Get("choices.0")
		if c.Get("finish_reason").Str != tc.finish || c.Get("message.content").Raw != `""` || len(c.Get("message.tool_calls").Array()) != 1 {
			t.Fatalf("tool_choice %s: %s", tc.choice, c.Raw)
		}
		sc := collectChat(t, parseSSE(t, post(t, base+"/chat/completions", inject(t, body, "stream", true)).body))
		if sc.finish[0] != tc.finish {
			t.Fatalf("tool_choice %s streamed: finish %q", tc.choice, sc.finish[0])
		}
	}
}

// TestVLLMHermesStream: a streamed tool call is a name chunk (content null,
// {id, type, index, function:{name}}), then argument chunks whose text adds
// up to the generated arguments; without logprobs or ids the tokens that add
// nothing send no chunk, with return_token_ids they send delta {} and the
// ids of every chunk add up to the answer's. The last token (end of turn)
// rides on the finish chunk.
func TestVLLMHermesStream(t *testing.T) {
	_, base := startT(t, Config{EndOfTurn: true})
	body := inject(t, toolsReq, "tool_choice", "required", "return_token_ids", true)
	full := mustOK(t, post(t, base+"/chat/completions", body))
	compact := string(appendCompactJSON(nil, full.Get("choices.0.message.tool_calls.0.function.arguments").Str))
	for _, withIDs := range []bool{false, true} {
		b := inject(t, body, "stream", true, "return_token_ids", withIDs)
		evs := parseSSE(t, post(t, base+"/chat/completions", b).body)
		var args strings.Builder
		var got []uint32
		names, empties := 0, 0
		for n, ev := range evs[1 : len(evs)-1] { // role chunk ... [DONE]
			c := gjson.Get(ev.data, "choices.0")
			d := c.Get("delta")
			got = append(got, ids(c.Get("token_ids"))...)
			final := n == len(evs)-3
			if final != (c.Get("finish_reason").Type == gjson.String) {
				t.Fatalf("chunk %d: finish_reason %s", n, c.Get("finish_reason").Raw)
			}
			switch {
			case d.Raw == "{}":
				empties++
			case d.Get("content").Type != gjson.Null || !d.Get("content").Exists():
				t.Fatalf("tool-call delta without content null: %s", d.Raw)
			case d.Get("tool_calls.0.function.name").Exists():
				names++
				if d.Get("tool_calls.0.function.arguments").Exists() || d.Get("tool_calls.0.id").Str == "" ||
					!strings.HasPrefix(d.Get("tool_calls.0").Raw, `{"id":`) {
					t.Fatalf("name chunk %s", d.Raw)
				}
			default:
				args.WriteString(d.Get("tool_calls.0.function.arguments").Str)
			}
		}
		if names != 1 || args.String() != compact {
			t.Fatalf("ids %v: %d name chunks, arguments %q, want %q", withIDs, names, args.String(), compact)
		}
		if last := evs[len(evs)-2].data; gjson.Get(last, "choices.0.delta").Raw != "{}" {
			t.Fatalf("finish chunk %s", last)
		}
		if withIDs != (empties > 1) || (withIDs && !eqIDs(got, ids(full.Get("choices.0.token_ids")))) {
			t.Fatalf("ids %v: %d empty deltas, streamed ids %v", withIDs, empties, got)
		}
	}
}

// TestVLLMStreamUsageAndHoldBack: continuous_usage_stats puts usage on every
// chunk; stop strings hold text back until the finish (vLLM's detokenizer),
// and the held-back text still adds up to the whole answer's.
func TestVLLMStreamUsageAndHoldBack(t *testing.T) {
	_, base := startT(t, Config{EndOfTurn: true})
	evs := parseSSE(t, post(t, base+"/chat/completions", inject(t, chatBody, "stream", true, "max_tokens", 3,
		"stream_options", map[string]any{"include_usage": true, "continuous_usage_stats": true})).body)
	for n, ev := range evs[:len(evs)-2] {
		u := gjson.Get(ev.data, "usage")
		if u.Get("completion_tokens").Int() != int64(n) || u.Get("completion_tokens_details").Type != gjson.Null || !u.Get("completion_tokens_details").Exists() {
			t.Fatalf("chunk %d usage %s", n, u.Raw)
		}
	}
	full := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "stop", []string{"##########"})))
	sc := collectChat(t, parseSSE(t, post(t, base+"/chat/completions", inject(t, chatBody, "stop", []string{"##########"}, "stream", true, "return_token_ids", true)).body))
	if sc.text[0] != full.Get("choices.0.message.content").Str {
		t.Fatalf("held-back stream text %q, whole %q", sc.text[0], full.Get("choices.0.message.content").Str)
	}
	// The first token (shorter than the 9 held-back characters) made an
	// empty delta: its chunk has ids but no content.
	first := parseSSE(t, post(t, base+"/chat/completions", inject(t, chatBody, "stop", []string{"##########"}, "stream", true, "return_token_ids", true)).body)[1]
	if gjson.Get(first.data, "choices.0.delta").Raw != "{}" {
		t.Fatalf("first chunk with a stop string: %s", first.data)
	}
}

// FuzzAppendPyJSON: json.dumps' separators change no value: the output is
// valid JSON equal to the input, and compacts back to it.
func FuzzAppendPyJSON(f *testing.F) {
	for _, s := range []string{`{"city":"Paris"}`, `{"a":[1,2,{"b":"x,y: z"}],"c":"\"q\":,"}`, `[]`, `"s"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var v any
		if json.Unmarshal([]byte(in), &v) != nil {
			return
		}
		compact := appendCompactJSON(nil, in)
		out := appendPyJSON(nil, compact)
		var w any
		if err := json.Unmarshal(out, &w); err != nil {
			t.Fatalf("%s -> %s: %v", compact, out, err)
		}
		a, _ := json.Marshal(v)
		b, _ := json.Marshal(w)
		if string(a) != string(b) || string(appendCompactJSON(nil, string(out))) != string(compact) {
			t.Fatalf("%s -> %s", compact, out)
		}
	})
}
