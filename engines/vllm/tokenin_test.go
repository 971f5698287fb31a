package vllm

import (
	"slices"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/engines"
)

// TestParseGenerateChunk reads vLLM 0.32's generate stream events: a step,
// a finish on a stop token, the usage chunk, an error event, bad events.
func TestParseGenerateChunk(t *testing.T) {
	var e Engine
	g, err := e.ParseGenerateChunk([]byte(`{"request_id":"generate-tokens-x","choices":[{"index":0,"token_ids":[5,6],"finish_reason":null,"logprobs":{"content":[{"token_id":5,"logprob":-0.5}]}}]}`))
	if err != nil || g.RequestID != "generate-tokens-x" || !g.HasChoice || !slices.Equal(g.Choice.IDs, []uint32{5, 6}) ||
		g.Choice.Finish != "" || g.Choice.EndedOnTurn || len(g.Choice.Logprobs.Array()) != 1 {
		t.Fatalf("step: %+v, %v", g, err)
	}
	g, err = e.ParseGenerateChunk([]byte(`{"choices":[{"index":0,"token_ids":[9],"finish_reason":"stop","stop_reason":9}]}`))
	if err != nil || g.Choice.Finish != "stop" || !g.Choice.EndedOnTurn || g.Choice.StopReason.Uint() != 9 {
		t.Fatalf("finish: %+v, %v", g, err)
	}
	g, err = e.ParseGenerateChunk([]byte(`{"choices":[{"index":0,"token_ids":[],"finish_reason":"stop","stop_reason":"END"}]}`))
	if err != nil || g.Choice.EndedOnTurn {
		t.Fatalf("a stop string is no end of turn: %+v, %v", g, err)
	}
	g, err = e.ParseGenerateChunk([]byte(`{"choices":[],"usage":{"prompt_tokens":3}}`))
	if err != nil || g.HasChoice || g.Usage.Get("prompt_tokens").Int() != 3 {
		t.Fatalf("usage: %+v, %v", g, err)
	}
	if g, err = e.ParseGenerateChunk([]byte(`{"error":{"message":"boom"}}`)); err != nil || !g.Error {
		t.Fatalf("error event: %+v, %v", g, err)
	}
	for _, bad := range []string{`[1]`, `{"choices":[{"index":0}]}`, `{"choices":[{"index":0,"token_ids":[-1]}]}`, `{"choices":[{"index":0,"token_ids":[]},{"index":1,"token_ids":[]}]}`, `{"choices":`} {
		if _, err := e.ParseGenerateChunk([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestDerenderStreamBody: a finish chunk's stop token is left out; a parked
// chunk goes without its finish reason and keeps its ids.
func TestDerenderStreamBody(t *testing.T) {
	var e Engine
	chunk := []byte(`{"choices":[{"index":0,"token_ids":[4,9],"finish_reason":"stop","stop_reason":9}]}`)
	g, err := e.ParseGenerateChunk(chunk)
	if err != nil {
		t.Fatal(err)
	}
	tail := e.DerenderStreamTail([]uint32{1, 2}, []byte(`{"model":"m","messages":[]}`))
	body, err := e.DerenderStreamBody(nil, chunk, g.Choice, false, nil, tail)
	if err != nil || !gjson.ValidBytes(body) {
		t.Fatalf("%s, %v", body, err)
	}
	b := gjson.ParseBytes(body)
	if b.Get("generate_chunk.choices.0.token_ids").Raw != "[4]" || b.Get("stream_state").Type != gjson.Null ||
		b.Get("prompt_token_ids").Raw != "[1,2]" || b.Get("model").Str != "m" || !b.Get("stream").Bool() {
		t.Fatalf("finish: %s", body)
	}
	abort := []byte(`{"choices":[{"index":0,"token_ids":[4],"finish_reason":"abort"}]}`)
	g, _ = e.ParseGenerateChunk(abort)
	body, err = e.DerenderStreamBody(nil, abort, g.Choice, true, []byte(`{"s":1}`), tail)
	b = gjson.ParseBytes(body)
	if err != nil || b.Get("generate_chunk.choices.0.finish_reason").Type != gjson.Null || b.Get("generate_chunk.choices.0.token_ids").Raw != "[4]" || b.Get("stream_state.s").Int() != 1 {
		t.Fatalf("parked: %s, %v", body, err)
	}
}

// TestResumeBody: prompt + ids so far, max_tokens reduced, a new request id;
// nothing left when max_tokens were all generated.
func TestResumeBody(t *testing.T) {
	var e Engine
	gen, err := e.GenerateBody([]byte(`{"token_ids":[],"sampling_params":{"max_tokens":5}}`), []uint32{1, 2}, engines.GenerateOptions{Stream: true, StreamOptions: []byte(`{"include_usage":true}`), RequestID: "r-0"})
	if err != nil || gjson.GetBytes(gen, "token_ids").Raw != "[1,2]" || gjson.GetBytes(gen, "request_id").Str != "r-0" || !gjson.GetBytes(gen, "stream_options.include_usage").Bool() {
		t.Fatalf("generate body %s, %v", gen, err)
	}
	if e.EngineRequestID("r-0") != "generate-tokens-r-0" {
		t.Fatalf("engine request id %q", e.EngineRequestID("r-0"))
	}
	body, left, err := e.ResumeBody(gen, []uint32{1, 2}, []uint32{7, 8}, "r-1")
	if err != nil || left != 3 || gjson.GetBytes(body, "token_ids").Raw != "[1,2,7,8]" || gjson.GetBytes(body, "sampling_params.max_tokens").Int() != 3 || gjson.GetBytes(body, "request_id").Str != "r-1" {
		t.Fatalf("resume body %s, left %d, %v", body, left, err)
	}
	if _, left, err = e.ResumeBody(gen, []uint32{1, 2}, []uint32{7, 8, 9, 10, 11}, "r-1"); err != nil || left != 0 {
		t.Fatalf("all generated: left %d, %v", left, err)
	}
}

// FuzzParseGenerateChunk: any event either fails or reads a choice with a
// valid index or -1; never a panic.
func FuzzParseGenerateChunk(f *testing.F) {
	for _, s := range []string{`{"choices":[{"index":0,"token_ids":[1],"finish_reason":"stop","stop_reason":null}]}`, `{"choices":[],"usage":{}}`, `{"error":{}}`, `{"choices":[{"index":1.5,"token_ids":[1e9]}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Engine{}.ParseGenerateChunk(data)
		if err != nil {
			return
		}
		if g.HasChoice && g.Choice.Index < -1 {
			t.Fatalf("%s: %+v", data, g)
		}
		if g.HasChoice {
			_, _ = Engine{}.DerenderStreamBody(nil, data, g.Choice, g.Choice.Finish == "abort", nil, nil)
		}
	})
}
