package mock

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Tests of the engine facts of docs/engines.md (the llama.cpp and vLLM facts), one
// per fact, against the flavour that imitates the engine.

// logprobIDs reads the "id" of every chat-shaped logprobs entry of a body or chunk.
func logprobIDs(j gjson.Result, path string) []uint32 {
	var out []uint32
	for _, e := range j.Get(path).Array() {
		out = append(out, uint32(e.Get("id").Uint()))
	}
	return out
}

// TestVLLMEndOfTurnInTokenIDs: vLLM's output token_ids include the stop token that
// ended the turn (v1 detokenizer: left out of the text, appended to token_ids), and
// usage counts it; a stream sends it with the finish chunk. A choice cut by max_tokens
// has none.
func TestVLLMEndOfTurnInTokenIDs(t *testing.T) {
	_, base := startT(t, Config{EndOfTurn: true})
	body := inject(t, chatBody, "return_token_ids", true, "logprobs", true)
	j := mustOK(t, post(t, base+"/chat/completions", body))
	got := ids(j.Get("choices.0.token_ids"))
	if len(got) != DefaultMaxTokens+1 || got[len(got)-1] != TokenIMEnd || j.Get("usage.completion_tokens").Int() != int64(len(got)) ||
		j.Get("choices.0.message.content").Str != Decode(got[:len(got)-1]) || len(j.Get("choices.0.logprobs.content").Array()) != len(got) {
		t.Fatalf("non-streamed: %s", j.Raw)
	}
	evs := parseSSE(t, post(t, base+"/chat/completions", inject(t, body, "stream", true, "stream_options", map[string]any{"include_usage": true})).body)
	sc := collectChat(t, evs)
	if !eqIDs(sc.ids[0], got) || sc.text[0] != j.Get("choices.0.message.content").Str || sc.lpCount[0] != len(got) ||
		sc.usage.Get("completion_tokens").Int() != int64(len(got)) {
		t.Fatalf("streamed ids %v text %q vs %v", sc.ids[0], sc.text[0], got)
	}
	fin := gjson.Parse(evs[len(evs)-3].data) // finish chunk, usage chunk, [DONE]
	if fin.Get("choices.0.finish_reason").Str != "stop" || fin.Get("choices.0.token_ids").Raw != "["+strconv.Itoa(TokenIMEnd)+"]" {
		t.Fatalf("finish chunk %s", fin.Raw)
	}
	// Completions too; a limit that leaves no room for it: no end-of-turn token.
	cj := mustOK(t, post(t, base+"/completions", `{"prompt":"hello the world","return_token_ids":true}`))
	if c := ids(cj.Get("choices.0.token_ids")); len(c) != DefaultMaxTokens+1 || c[len(c)-1] != TokenIMEnd || cj.Get("choices.0.text").Str != Decode(c[:len(c)-1]) {
		t.Fatalf("completion %s", cj.Raw)
	}
	var streamed []uint32
	for _, ev := range parseSSE(t, post(t, base+"/completions", `{"prompt":"hello the world","return_token_ids":true,"stream":true}`).body) {
		streamed = append(streamed, ids(gjson.Get(ev.data, "choices.0.token_ids"))...)
	}
	if !eqIDs(streamed, ids(cj.Get("choices.0.token_ids"))) {
		t.Fatalf("streamed completion ids %v", streamed)
	}
	lj := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "return_token_ids", true, "max_tokens", DefaultMaxTokens)))
	if l := ids(lj.Get("choices.0.token_ids")); len(l) != DefaultMaxTokens || l[len(l)-1] == TokenIMEnd || lj.Get("choices.0.finish_reason").Str != "length" {
		t.Fatalf("limit (finish_reason must be length: the limit came before the end-of-turn token): %s", lj.Raw)
	}
}

// TestLlamaCppEndOfTurnLogprobs: llama.cpp counts the end-of-turn token in usage
// (n_decoded) and lists it in the logprobs of a non-streamed answer, but a chat
// stream carries no logprobs for it: it adds no text, so it makes no delta and no
// chunk. A completion stream sends it as a chunk of its own (text "").
func TestLlamaCppEndOfTurnLogprobs(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorLlamaCpp, EndOfTurn: true})
	body := inject(t, chatBody, "logprobs", true, "top_logprobs", 1)
	j := mustOK(t, post(t, base+"/chat/completions", body))
	full := logprobIDs(j, "choices.0.logprobs.content")
	if len(full) != DefaultMaxTokens+1 || full[len(full)-1] != TokenIMEnd || j.Get("usage.completion_tokens").Int() != int64(len(full)) ||
		j.Get("choices.0.message.content").Str != Decode(full[:len(full)-1]) {
		t.Fatalf("non-streamed: %s", j.Raw)
	}
	// A control token's piece is empty: its entry has no text and no bytes.
	if e := j.Get("choices.0.logprobs.content." + strconv.Itoa(len(full)-1)); e.Get("token").Raw != `""` || e.Get("bytes").Raw != `[]` {
		t.Fatalf("end-of-turn entry %s", e.Raw)
	}
	var streamed []uint32
	var timings gjson.Result
	for _, ev := range parseSSE(t, post(t, base+"/chat/completions", inject(t, body, "stream", true)).body) {
		c := gjson.Parse(ev.data)
		streamed = append(streamed, logprobIDs(c, "choices.0.logprobs.content")...)
		if c.Get("timings").Exists() {
			timings = c.Get("timings")
		}
	}
	if !eqIDs(streamed, full[:len(full)-1]) || timings.Get("predicted_n").Int() != int64(len(full)) {
		t.Fatalf("streamed logprob ids %v (want all but the last of %v), timings %s", streamed, full, timings.Raw)
	}
	cbody := `{"prompt":"hello the world","logprobs":1}`
	cj := mustOK(t, post(t, base+"/completions", cbody))
	cfull := logprobIDs(cj, "choices.0.logprobs.content")
	streamed = streamed[:0]
	for _, ev := range parseSSE(t, post(t, base+"/completions", inject(t, cbody, "stream", true)).body) {
		streamed = append(streamed, logprobIDs(gjson.Parse(ev.data), "choices.0.logprobs.content")...)
	}
	if len(cfull) != DefaultMaxTokens+1 || cfull[len(cfull)-1] != TokenIMEnd || !eqIDs(streamed, cfull) {
		t.Fatalf("completion logprob ids %v, streamed %v", cfull, streamed)
	}
}

// TestLlamaCppTimingsPlacement: the final result's timings ride on its last chunk:
// the finish chunk, or the usage chunk when include_usage is set; a completion
// stream's finish chunk carries usage and timings whether asked or not.
func TestLlamaCppTimingsPlacement(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorLlamaCpp})
	for _, tc := range []struct {
		path, body    string
		usageOnFinish bool
	}{
		{"/chat/completions", inject(t, chatBody, "stream", true), false},
		{"/chat/completions", inject(t, chatBody, "stream", true, "stream_options", map[string]any{"include_usage": true}), false},
		{"/completions", `{"prompt":"hello the world","stream":true}`, true},
		{"/completions", `{"prompt":"hello the world","stream":true,"stream_options":{"include_usage":true}}`, true},
	} {
		evs := parseSSE(t, post(t, base+tc.path, tc.body).body)
		var withTimings []string
		for _, ev := range evs {
			if gjson.Get(ev.data, "timings").Exists() {
				withTimings = append(withTimings, ev.data)
			}
		}
		last := gjson.Parse(evs[len(evs)-2].data) // before [DONE]
		asked := strings.Contains(tc.body, "include_usage")
		switch {
		case len(withTimings) != 1 || withTimings[0] != last.Raw:
			t.Fatalf("%s %s: timings on %d chunks, want the last: %v", tc.path, tc.body, len(withTimings), withTimings)
		case tc.usageOnFinish && (last.Get("choices.0.finish_reason").Str == "" || !last.Get("usage").Exists()):
			t.Fatalf("completion finish chunk %s", last.Raw)
		case !tc.usageOnFinish && asked && (len(last.Get("choices").Array()) != 0 || !last.Get("usage").Exists()):
			t.Fatalf("usage chunk %s", last.Raw)
		case !tc.usageOnFinish && !asked && (last.Get("choices.0.finish_reason").Str != "stop" || last.Get("usage").Exists()):
			t.Fatalf("finish chunk %s", last.Raw)
		}
		if tm := last.Get("timings"); tm.Get("prompt_n").Int()+tm.Get("cache_n").Int() == 0 || tm.Get("predicted_n").Int() != DefaultMaxTokens {
			t.Fatalf("timings %s", tm.Raw)
		}
	}
}

// TestCompletionsLogprobsTrue: "logprobs": true on /v1/completions (sent by clients
// that treat completions like chat, e.g. Agent Lightning) is not an error: vLLM's
// CompletionRequest.logprobs is an int validated in pydantic's lax mode, which takes
// true as 1 (false as 0); llama.cpp reads it as n_probs 1. Either way the answer
// carries the sampled token and one alternative per token.
func TestCompletionsLogprobsTrue(t *testing.T) {
	for _, fl := range []Flavor{FlavorVLLM, FlavorLlamaCpp} {
		_, base := startT(t, Config{Flavor: fl})
		asTrue := mustOK(t, post(t, base+"/completions", `{"prompt":"hello the world","max_tokens":4,"logprobs":true}`))
		asOne := mustOK(t, post(t, base+"/completions", `{"prompt":"hello the world","max_tokens":4,"logprobs":1}`))
		if asTrue.Get("choices.0.logprobs").Raw != asOne.Get("choices.0.logprobs").Raw || asTrue.Get("choices.0.logprobs").Type == gjson.Null {
			t.Fatalf("%s: logprobs true %s vs 1 %s", fl, asTrue.Get("choices.0.logprobs").Raw, asOne.Get("choices.0.logprobs").Raw)
		}
		f := mustOK(t, post(t, base+"/completions", `{"prompt":"hello the world","max_tokens":4,"logprobs":false}`))
		if (fl == FlavorLlamaCpp) != (f.Get("choices.0.logprobs").Type == gjson.Null) {
			t.Fatalf("%s: logprobs false %s", fl, f.Get("choices.0.logprobs").Raw)
		}
	}
}

// TestStopStrings: a matched stop string ends the answer at the token completing it,
// is counted in usage and left out of the text. vLLM keeps its tokens in token_ids
// (and names it in stop_reason); llama.cpp leaves them out of the logprobs: a
// non-streamed answer's by as many tokens as the stop string tokenizes to, a chat
// stream's wherever the text was held back as a possible stop string and then cut.
func TestStopStrings(t *testing.T) {
	_, vbase := startT(t, Config{})
	_, lbase := startT(t, Config{Flavor: FlavorLlamaCpp})
	plain := mustOK(t, post(t, vbase+"/chat/completions", inject(t, chatBody, "return_token_ids", true)))
	all := ids(plain.Get("choices.0.token_ids"))
	text := func(ids []uint32) string { return Decode(ids) }
	// k: a token whose text, and the text of it and the next token, first occur there.
	k := 3
	for ; k < len(all)-1; k++ {
		w, w2 := TokenString(all[k]), TokenString(all[k])+TokenString(all[k+1])
		if len(w) >= 4 && strings.Index(text(all), w2) == len(text(all[:k])) && strings.Index(text(all), w) == len(text(all[:k])) &&
			strings.Index(text(all), w[2:]) == len(text(all[:k]))+2 {
			break
		}
	}
	if k == len(all)-1 {
		t.Fatalf("no usable token in %q", text(all))
	}
	for _, tc := range []struct {
		name       string
		stop       string
		last       int // index of the token completing the match
		textLen    int // bytes of text kept
		streamedLP int // logprob entries in a llama.cpp chat stream
	}{
		{"one token", TokenString(all[k]), k, len(text(all[:k])), k},
		{"two tokens", TokenString(all[k]) + TokenString(all[k+1]), k + 1, len(text(all[:k])), k},
		// Inside a token: the text before the match in that token is sent with it.
		{"inside a token", TokenString(all[k])[2:], k, len(text(all[:k])) + 2, k + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantText := text(all)[:tc.textLen]
			v := mustOK(t, post(t, vbase+"/chat/completions", inject(t, chatBody, "return_token_ids", true, "stop", []string{tc.stop})))
			if got := ids(v.Get("choices.0.token_ids")); !eqIDs(got, all[:tc.last+1]) || v.Get("choices.0.message.content").Str != wantText ||
				v.Get("choices.0.finish_reason").Str != "stop" || v.Get("choices.0.stop_reason").Str != tc.stop ||
				v.Get("usage.completion_tokens").Int() != int64(tc.last+1) {
				t.Fatalf("vllm: %s", v.Raw)
			}
			sc := collectChat(t, parseSSE(t, post(t, vbase+"/chat/completions", inject(t, chatBody, "return_token_ids", true, "stream", true, "stop", tc.stop)).body))
			if !eqIDs(sc.ids[0], all[:tc.last+1]) || sc.text[0] != wantText {
				t.Fatalf("vllm stream: %v %q", sc.ids[0], sc.text[0])
			}
			body := inject(t, chatBody, "logprobs", true, "top_logprobs", 1, "stop", []string{tc.stop})
			l := mustOK(t, post(t, lbase+"/chat/completions", body))
			trim := min(len(Encode(tc.stop)), tc.last+1)
			if got := logprobIDs(l, "choices.0.logprobs.content"); !eqIDs(got, all[:tc.last+1-trim]) ||
				l.Get("choices.0.message.content").Str != wantText || l.Get("usage.completion_tokens").Int() != int64(tc.last+1) {
				t.Fatalf("llama.cpp: logprob ids %v (want %d of %v): %s", got, tc.last+1-trim, all, l.Raw)
			}
			var streamed []uint32
			content := ""
			for _, ev := range parseSSE(t, post(t, lbase+"/chat/completions", inject(t, body, "stream", true)).body) {
				c := gjson.Parse(ev.data)
				streamed = append(streamed, logprobIDs(c, "choices.0.logprobs.content")...)
				content += c.Get("choices.0.delta.content").Str
			}
			if !eqIDs(streamed, all[:tc.streamedLP]) || content != wantText {
				t.Fatalf("llama.cpp stream: logprob ids %v (want %v), text %q", streamed, all[:tc.streamedLP], content)
			}
		})
	}
}

// TestSplitCharacters: a character split over byte tokens. vLLM returns every token
// (token_ids, logprobs, one stream chunk each) and the text once the character is
// whole; llama.cpp counts them in usage but leaves the tokens after which the text
// ends inside the character out of logprobs and streams, streamed or not.
func TestSplitCharacters(t *testing.T) {
	_, vbase := startT(t, Config{SplitChars: 4})
	_, lbase := startT(t, Config{Flavor: FlavorLlamaCpp, SplitChars: 4})
	v := mustOK(t, post(t, vbase+"/chat/completions", inject(t, chatBody, "return_token_ids", true, "logprobs", true)))
	all := ids(v.Get("choices.0.token_ids"))
	content := v.Get("choices.0.message.content").Str
	if len(all) != DefaultMaxTokens || !strings.Contains(content, splitChar) || Decode(all) != content ||
		len(v.Get("choices.0.logprobs.content").Array()) != len(all) || v.Get("usage.completion_tokens").Int() != int64(len(all)) {
		t.Fatalf("vllm: %s", v.Raw)
	}
	sc := collectChat(t, parseSSE(t, post(t, vbase+"/chat/completions", inject(t, chatBody, "return_token_ids", true, "stream", true)).body))
	if !eqIDs(sc.ids[0], all) || sc.text[0] != content {
		t.Fatalf("vllm stream %v %q", sc.ids[0], sc.text[0])
	}
	// What llama.cpp lists: every token after which the text is whole UTF-8.
	var whole []uint32
	for i := range all {
		if utf8.ValidString(Decode(all[:i+1])) {
			whole = append(whole, all[i])
		}
	}
	if len(whole) >= len(all) || len(whole) < len(all)-6 {
		t.Fatalf("split characters: %d of %d tokens whole", len(whole), len(all))
	}
	body := inject(t, chatBody, "logprobs", true, "top_logprobs", 1)
	l := mustOK(t, post(t, lbase+"/chat/completions", body))
	if got := logprobIDs(l, "choices.0.logprobs.content"); !eqIDs(got, whole) || l.Get("choices.0.message.content").Str != content ||
		l.Get("usage.completion_tokens").Int() != int64(len(all)) {
		t.Fatalf("llama.cpp: %v, want %v: %s", got, whole, l.Raw)
	}
	for _, path := range []string{"/chat/completions", "/completions"} {
		req := inject(t, body, "stream", true)
		if path == "/completions" {
			req = `{"prompt":"hello the world","logprobs":1,"stream":true}`
		}
		var streamed []uint32
		text := ""
		for _, ev := range parseSSE(t, post(t, lbase+path, req).body) {
			c := gjson.Parse(ev.data)
			streamed = append(streamed, logprobIDs(c, "choices.0.logprobs.content")...)
			text += c.Get("choices.0.delta.content").Str + c.Get("choices.0.text").Str
		}
		if len(streamed) >= DefaultMaxTokens || !utf8.ValidString(text) || !strings.Contains(text, splitChar) {
			t.Fatalf("llama.cpp %s stream: %d logprob ids, text %q", path, len(streamed), text)
		}
		if path == "/chat/completions" && !eqIDs(streamed, whole) {
			t.Fatalf("llama.cpp chat stream: %v, want %v", streamed, whole)
		}
	}
}
