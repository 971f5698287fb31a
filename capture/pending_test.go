package capture

import (
	"bytes"
	"encoding/json"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"weak"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

// checkPendingStream feeds payloads to a Pending (assembled event by event)
// and to an Assembler that sees every payload at the end (how capture
// assembled streams before), and fails unless both give the same result and
// the payloads Pending keeps give the token-id fallback the same ids as all
// of them.
func checkPendingStream(t *testing.T, endpoint openai.Endpoint, payloads [][]byte) {
	t.Helper()
	p := AcquirePending()
	defer releasePending(p)
	p.Endpoint = endpoint
	var all fallback.LogprobIDs
	var ref Assembler
	ref.noHead = true  // reads every chunk whole: the shortcut must not change results
	ref.noIndex = true // walks without containerEnds: the index must not change results
	ref.Reset(endpoint)
	for _, d := range payloads {
		p.AddEvent(d)
		all.Add(d)
		ref.AddChunk(d)
	}
	if len(payloads) == 0 {
		return
	}
	if msg := diffAssembled(p.asm.Result(), ref.Result()); msg != "" {
		t.Fatalf("incremental assembly differs: %s", msg)
	}
	checkBuiltStrings(t, p, ref.Result())
	var kept fallback.LogprobIDs
	nKept := 0
	p.eachEvent(func(d []byte) { kept.Add(d); nKept++ })
	if p.asm.noLogprobIDs {
		// Pending kept nothing because the fallback, reading every payload,
		// fails for some choice that is a row of the call: it must.
		if nKept != 0 {
			t.Fatalf("%d payloads kept after a logprobs entry without an id", nKept)
		}
		for _, c := range p.asm.Result().Choices {
			if _, ok := all.IDs(c.Index); !ok {
				return
			}
		}
		t.Fatalf("payloads dropped, but the fallback reads ids for every choice from all of them (choices %v)", all.Choices())
	}
	if !slices.Equal(kept.Choices(), all.Choices()) {
		t.Fatalf("fallback choices from the %d kept payloads %v, from all %d %v", nKept, kept.Choices(), len(payloads), all.Choices())
	}
	for _, i := range all.Choices() {
		ki, kok := kept.IDs(i)
		ai, aok := all.IDs(i)
		if kok != aok || !slices.Equal(ki, ai) {
			t.Fatalf("choice %d: fallback ids from kept payloads %v %v, from all %v %v", i, ki, kok, ai, aok)
		}
	}
}

// checkBuiltStrings checks the strings a stream's assembly hands to the rows
// without a copy: the body is measured exactly before it is built (one
// allocation), and Rows puts in each row the same body and message as want.
func checkBuiltStrings(t *testing.T, p *Pending, want *Assembled) {
	t.Helper()
	a := &p.asm
	if a.kind != openai.Responses {
		w := bodyWriter{count: true}
		a.writeBody(&w, a.kind != openai.Completions)
		if w.n != len(a.bodyStr) {
			t.Fatalf("body measured %d bytes, built %d: %s", w.n, len(a.bodyStr), a.bodyStr)
		}
	}
	rows := Rows(p, nil)
	for i := range rows {
		if rows[i].ResponseBody != string(want.ResponseBody) {
			t.Fatalf("row %d: response_body %q, want %q", i, rows[i].ResponseBody, want.ResponseBody)
		}
		if len(want.Choices) > 0 && rows[i].ResponseMessage != string(want.Choices[i].Message) {
			t.Fatalf("row %d: response_message %q, want %q", i, rows[i].ResponseMessage, want.Choices[i].Message)
		}
	}
}

// diffAssembled describes how x and y differ ("" when equal; NaN logprobs
// compare equal to NaN).
func diffAssembled(x, y *Assembled) string {
	switch {
	case !bytes.Equal(x.ResponseBody, y.ResponseBody):
		return "body " + string(x.ResponseBody) + " vs " + string(y.ResponseBody)
	case !slices.Equal(x.PromptTokenIDs, y.PromptTokenIDs):
		return "prompt ids"
	case x.Usage != y.Usage:
		return "usage"
	case x.Error != y.Error:
		return "error " + x.Error + " vs " + y.Error
	case x.Model != y.Model || x.ID != y.ID:
		return "model or id"
	case len(x.Choices) != len(y.Choices):
		return "number of choices"
	}
	for i := range x.Choices {
		a, b := &x.Choices[i], &y.Choices[i]
		if a.Index != b.Index || !bytes.Equal(a.Message, b.Message) || !slices.Equal(a.PromptTokenIDs, b.PromptTokenIDs) ||
			!slices.Equal(a.TokenIDs, b.TokenIDs) || a.HasTokenIDs != b.HasTokenIDs || a.FinishReason != b.FinishReason ||
			len(a.Logprobs) != len(b.Logprobs) {
			return "choice " + string(a.Message) + " vs " + string(b.Message)
		}
		for j := range a.Logprobs {
			if math.Float32bits(a.Logprobs[j]) != math.Float32bits(b.Logprobs[j]) {
				return "logprobs"
			}
		}
	}
	return ""
}

// linePayloads splits in into payloads, one per line, "data: " removed.
func linePayloads(in []byte) [][]byte {
	var out [][]byte
	for line := range bytes.Lines(in) {
		out = append(out, bytes.TrimPrefix(line, []byte("data: ")))
	}
	return out
}

func TestPendingKeepsOnlyLogprobPayloads(t *testing.T) {
	f := func(name string, endpoint openai.Endpoint, stream string, wantKept int) {
		t.Helper()
		payloads := streamPayloads(stream)
		checkPendingStream(t, endpoint, payloads)
		p := AcquirePending()
		defer releasePending(p)
		p.Endpoint = endpoint
		for _, d := range payloads {
			p.AddEvent(d)
		}
		if len(p.eventEnds) != wantKept {
			t.Errorf("%s: %d of %d payloads kept, want %d", name, len(p.eventEnds), len(payloads), wantKept)
		}
	}
	f("plain chat stream", openai.ChatCompletions, benchChatStream(16), 0)
	f("chat with logprobs", openai.ChatCompletions, sse(
		`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"token_id:5","logprob":-1}]}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":"stop"}]}`,
		`[DONE]`), 1)
	f("escaped key", openai.ChatCompletions, sse(
		`{"choices":[{"index":0,"delta":{"content":"a"},"logprob\u0073":{"content":[{"token":"token_id:5"}]}}]}`), 1)
	f("duplicate choices", openai.ChatCompletions, sse(
		`{"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:5"}]}}],"choices":[]}`), 1)
	f("choices object", openai.ChatCompletions, sse(
		`{"choices":{"a":{"index":0,"logprobs":{"content":[{"token":"token_id:5"}]}}}}`), 1)
	f("responses stream", openai.Responses, sse(
		`{"type":"response.output_text.delta","delta":"x"}`,
		`{"type":"response.completed","response":`+respCompleted+`}`), 0)
	f("not an object", openai.ChatCompletions, sse(`[1]`, `"x"`), 2)
}

func TestPendingResetForgetsStream(t *testing.T) {
	p := AcquirePending()
	p.Endpoint = openai.ChatCompletions
	for _, d := range streamPayloads(benchChatStream(4)) {
		p.AddEvent(d)
	}
	// reset is what releasePending does before pooling (called directly, so
	// the test does not depend on sync.Pool handing the same Pending back).
	p.reset()
	if p.Streamed() || len(p.eventEnds) != 0 || p.nEvents != 0 {
		t.Fatal("a reset Pending still holds its stream")
	}
	// A non-streamed call on the recycled Pending is read from its body.
	q := p
	q.Meta = export.Call{SpanID: "s", SequenceID: 1, HTTPStatus: 200, Endpoint: "/v1/chat/completions"}
	q.Endpoint = openai.ChatCompletions
	q.Body = append(q.Body[:0], pending(1).Body...)
	var a Assembler
	rows := Rows(q, &a)
	if len(rows) != 1 || rows[0].ResponseBody != string(q.Body) || !strings.Contains(rows[0].ResponseMessage, "hi") {
		t.Fatalf("rows %+v", rows)
	}
}

// FuzzPendingEvents: assembling a stream event by event (Pending.AddEvent)
// gives what assembling all its payloads at the end gives, and the payloads
// kept for the token-id fallback give it the same ids as all of them.
func FuzzPendingEvents(f *testing.F) {
	f.Add([]byte(benchChatStream(3)), uint8(1))
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"arguments":"{\""}}]}}]}`, `{"error":{"message":"x"}}`)), uint8(1))
	f.Add([]byte(sse(`{"object":"text_completion","choices":[{"index":5,"text":"x","logprobs":{"tokens":["token_id:7"],"token_logprobs":[null]},"prompt_token_ids":[1]}]}`)), uint8(0))
	f.Add([]byte(sse(`{"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:5"}]},"logprobs":null}]}`)), uint8(1))
	f.Add([]byte(sse(`{"choice\u0073":[{"index":1,"logprobs":{"content":[{"id":3}]}}]}`)), uint8(2))
	f.Add([]byte(sse(`{"type":"response.completed","response":`+respCompleted+`}`, `{"choices":[{"index":0,"logprobs":{"content":[{"id":3}]}}]}`)), uint8(0))
	// Chunks sharing a head (Assembler.head), with the traps the shortcut must
	// respect: a flat error object, escapes, duplicate keys, a head key that
	// is not a string, a chunk that breaks after the head.
	f.Add([]byte(sse(
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1,2]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"token_ids":[5]}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"\u0062"},"token_ids":[6]}],"prompt_token_ids":[9]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":1,"delta":{"content":"x"}}],"choices":[{"index":0}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"c"}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}`,
		`[DONE]`)), uint8(1))
	f.Add([]byte(sse(
		`{"id":7,"object":"text_completion","created":"x","model":"m","choices":[{"index":0,"text":"a","token_ids":[1]}]}`,
		`{"id":7,"object":"text_completion","created":"x","model":"m","choices":[{"index":0,"text":"b","token_ids":[2]}],"error":"late"}`,
		`{"id":"late","object":"text_completion","created":2,"model":"m2","choices":[{"index":0,"text":"c"}]}`)), uint8(2))
	f.Add([]byte(sse(
		`{"object":"error","model":"m","choices":[],"message":"boom","type":"BadRequest"}`,
		`{"object":"error","model":"m","choices":[],"message":"again"}`)), uint8(0))
	// logprobs entries read through the index (Assembler.logprobOf) and
	// without it: duplicate keys, -0, huge and non-number values, an escaped
	// key, entries that are not objects.
	f.Add([]byte(sse(
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[{"token":"a","logprob":-0.5}]}]},"token_ids":[5]}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"logprobs":{"content":[{"logprob":-0,"logprob":-2},{"logprob":1e400},{"logprob":"x"},{"log\u0070rob":-3},[1],"s",{}]}}]}`,
		`[DONE]`)), uint8(1))
	// The regular shapes the fast path takes (assemble_fast_test.go), and
	// small deviations it must leave to the general path or read alike: an
	// extra key, keys reordered, escapes, whitespace, n=2, logprobs null,
	// the completions shape, a duplicate key.
	f.Add([]byte(sse(fastVLLMRole, fastVLLMLP, fastVLLMLP, fastVLLMEnd, fastUsage, "[DONE]")), uint8(1))
	f.Add([]byte(sse(fastVLLMRole, fastVLLM, strings.Replace(fastVLLM, `"token_ids"`, `"extra":[{}],"token_ids"`, 1),
		strings.Replace(fastVLLM, `"index":0,"delta":{"content":" x"}`, `"delta":{"content":"\u00e9\n"}, "index":0`, 1),
		strings.ReplaceAll(fastVLLM, ",", " ,\t"), fastN2, fastVLLMEnd)), uint8(1))
	f.Add([]byte(sse(fastSGLang, fastLlama, fastTools, strings.Replace(fastVLLMLP, `"index":0,`, `"index":0,"index":1,`, 1))), uint8(1))
	f.Add([]byte(sse(fastCompl, fastComplLP, strings.Replace(fastCompl, `"text":" x"`, `"text":"y","text":"z"`, 1))), uint8(2))
	f.Fuzz(func(t *testing.T, in []byte, ep uint8) {
		checkPendingStream(t, openai.Endpoint(ep%5), linePayloads(in))
	})
}

// BenchmarkPendingStream256 is record assembly of a 256-token chat stream as
// the gateway hands it over: one AddEvent per SSE payload, then Rows.
func BenchmarkPendingStream256(b *testing.B) { benchPendingStream(b, false, nil) }

// BenchmarkPendingStream256Logprobs is BenchmarkPendingStream256 with the
// sampled token's logprobs in every chunk, as the gateway asks vLLM and
// SGLang for them by default.
func BenchmarkPendingStream256Logprobs(b *testing.B) { benchPendingStream(b, true, nil) }

// BenchmarkPendingStream256LogprobsAgent is BenchmarkPendingStream256Logprobs
// with an 8 KB agent request (benchAgentRequest), taken as the gateway takes
// it.
func BenchmarkPendingStream256LogprobsAgent(b *testing.B) {
	benchPendingStream(b, true, benchAgentRequest())
}

func benchPendingStream(b *testing.B, logprobs bool, req []byte) {
	payloads := streamPayloads(string(benchStreamOf(256, logprobs)))
	if req == nil {
		req = []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	}
	var a Assembler
	b.ReportAllocs()
	for b.Loop() {
		p := AcquirePending()
		p.Endpoint = openai.ChatCompletions
		p.Meta.HTTPStatus = 200
		p.Request = string(req)
		for _, d := range payloads {
			p.AddEvent(d)
		}
		if rows := Rows(p, &a); len(rows) != 1 || len(rows[0].ResponseTokenIDs) != 256 || logprobs != (len(rows[0].ResponseLogprobs) == 256) {
			b.Fatalf("rows %+v", rows)
		}
		releasePending(p)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(payloads)), "ns/chunk")
}

// TestPendingHead: Head is the bytes before "choices" of the last chunk when
// only id, object, created and model came before it, nil otherwise and
// before any event.
func TestPendingHead(t *testing.T) {
	p := AcquirePending()
	defer releasePending(p)
	p.Endpoint = openai.ChatCompletions
	if p.Head() != nil {
		t.Fatal("head before any event")
	}
	const head = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",`
	p.AddEvent([]byte(head + `"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`))
	if string(p.Head()) != head {
		t.Fatalf("head %q, want %q", p.Head(), head)
	}
	p.AddEvent([]byte(head + `"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":null}]}`))
	if string(p.Head()) != head {
		t.Fatalf("head after a chunk read without it %q", p.Head())
	}
	p.AddEvent([]byte(`{"id":"c1","usage":{"prompt_tokens":1},"choices":[]}`))
	if p.Head() != nil {
		t.Fatalf("head %q after a chunk with another member before choices", p.Head())
	}
}

// benchAgentRequest is a chat request as an agent sends it a few turns in:
// a system prompt and six turns, about 8 KB.
func benchAgentRequest() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"Qwen/Qwen3-8B","stream":true,"stream_options":{"include_usage":true},"logprobs":true,"max_tokens":256,"messages":[`)
	b.WriteString(`{"role":"system","content":"` + strings.Repeat("You are a careful agent. ", 40) + `"}`)
	for i := range 6 {
		b.WriteString(`,{"role":"user","content":"` + strings.Repeat(`observation \"x\"\n`, 50) + `"}`)
		b.WriteString(`,{"role":"assistant","content":"` + strings.Repeat("thought ", 30) + strconv.Itoa(i) + `"}`)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkRowsStream256Logprobs is Rows alone on a finished 256-token chat
// stream with logprobs and an 8 KB agent request: the assembled body and
// message built and turned into the row's strings, the request copied into
// it. The events are fed once; each iteration makes the Assembler build its
// result again, as for a new call.
func BenchmarkRowsStream256Logprobs(b *testing.B) {
	payloads := streamPayloads(string(benchStreamOf(256, true)))
	p := AcquirePending()
	p.Endpoint = openai.ChatCompletions
	p.Meta.HTTPStatus = 200
	p.Request = string(benchAgentRequest())
	if !json.Valid([]byte(p.Request)) {
		b.Fatal("invalid request")
	}
	for _, d := range payloads {
		p.AddEvent(d)
	}
	var a Assembler
	b.ReportAllocs()
	for b.Loop() {
		p.asm.built, p.N = false, 0
		rows := Rows(p, &a)
		if len(rows) != 1 || len(rows[0].ResponseTokenIDs) != 256 || len(rows[0].ResponseLogprobs) != 256 ||
			len(rows[0].RequestBody) < 8000 || len(rows[0].ResponseBody) < 15000 {
			b.Fatalf("rows %d, body %d", len(rows), len(rows[0].ResponseBody))
		}
	}
}

// TestPendingResetLetsGoOfTheAssembledBody: a pooled Pending must not keep
// the body assembled from its last stream (nor the messages sliced from it)
// alive until its next call: under 1,000 open streams that pinned a finished
// answer per pooled Pending, 4 MB of live heap. Rows built from it keep
// their own reference, so the body is collectable once they are gone.
func TestPendingResetLetsGoOfTheAssembledBody(t *testing.T) {
	p := AcquirePending()
	p.Meta = export.Call{SpanID: "s", SequenceID: 1, HTTPStatus: 200, Endpoint: "/v1/chat/completions"}
	p.Endpoint = openai.ChatCompletions
	for _, d := range streamPayloads(benchChatStream(64)) {
		p.AddEvent(d)
	}
	var a Assembler
	rows := Rows(p, &a)
	if len(rows) != 1 || !strings.Contains(rows[0].ResponseBody, `"logprobs"`) || p.asm.bodyStr == "" {
		t.Fatalf("no body assembled from the stream: rows %+v", rows)
	}
	body := weak.Make(&jsonscan.Bytes(p.asm.bodyStr)[0]) // the body's first byte: its allocation
	rows = nil
	p.reset() // what releasePending does before pooling
	for range 3 {
		runtime.GC()
	}
	if body.Value() != nil {
		t.Fatal("a reset Pending still keeps its last stream's assembled body alive")
	}
	runtime.KeepAlive(p)
	releasePending(p)
}
