package capture

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

// Chunks of the shapes engines stream (bench/mock, docs/engines.md), which
// the fast path must take.
const (
	fastHead     = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1730000000,"model":"m",`
	fastVLLMLP   = fastHead + `"choices":[{"index":0,"delta":{"content":" x"},"logprobs":{"content":[{"token":" x","logprob":-1.2,"bytes":[32,120],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[461]}]}`
	fastVLLM     = fastHead + `"choices":[{"index":0,"delta":{"content":" x"},"logprobs":null,"finish_reason":null,"token_ids":[461]}]}`
	fastVLLMRole = fastHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}`
	fastVLLMEnd  = fastHead + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[]}]}`
	fastUsage    = fastHead + `"choices":[],"usage":{"prompt_tokens":14,"total_tokens":16,"completion_tokens":2}}`
	fastSGLang   = fastHead + `"choices":[{"index":0,"delta":{"role":null,"content":"x","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`
	fastLlama    = `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"x"}}],"created":1730000000,"id":"chatcmpl-1","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk","timings":{"prompt_n":3,"cache_n":1,"predicted_n":1}}`
	fastCompl    = `{"id":"cmpl-1","object":"text_completion","created":1730000000,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[5],"prompt_token_ids":null}],"usage":null}`
	fastComplLP  = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" x","logprobs":{"text_offset":[0],"token_logprobs":[-0.5],"tokens":[" x"],"top_logprobs":[null]},"finish_reason":null}]}`
	fastTools    = fastHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\""}}]},"logprobs":null,"finish_reason":null}]}`
	fastN2       = fastHead + `"choices":[{"index":1,"delta":{"content":"b"},"token_ids":[2]},{"index":0,"delta":{"reasoning":"a\n"},"token_ids":[1]}]}`
)

// TestFastPathTakes: the regular shapes go through the fast path, and what
// it does not understand goes to the general path.
func TestFastPathTakes(t *testing.T) {
	for _, c := range []struct {
		chunk string
		take  bool
	}{
		{fastVLLMLP, true}, {fastVLLM, true}, {fastVLLMRole, true}, {fastVLLMEnd, true}, {fastUsage, true},
		{fastSGLang, true}, {fastLlama, true}, {fastCompl, true}, {fastComplLP, true}, {fastTools, true}, {fastN2, true},
		{" \t" + fastVLLM + "\r\n", true},
		{strings.ReplaceAll(fastVLLMLP, ",", " ,\n\t"), true},
		{strings.ReplaceAll(fastVLLMLP, `" x"`, `"\u0020x"`), true},
		{strings.Replace(fastVLLM, `"token_ids"`, `"extra":{"a":[1,{"b":null}]},"token_ids"`, 1), true},
		// Not taken.
		{`{}`, true},
		{`[1]`, false},
		{strings.Replace(fastVLLM, `"index":0,`, `"index":0,"index":1,`, 1), false},       // duplicate key
		{strings.Replace(fastVLLM, `"model":"m",`, `"model":"m","model":"m",`, 1), false}, // duplicate key
		{strings.Replace(fastVLLM, `"index"`, `"ind\u0065x"`, 1), false},                  // escaped key
		{strings.Replace(fastVLLM, `"delta"`, `"message"`, 1), false},                     // whole message
		{strings.Replace(fastVLLM, `"chat.completion.chunk"`, `"error"`, 1), false},       // flat error
		{strings.Replace(fastVLLM, `"chat.completion.chunk"`, `"\u0065rror"`, 1), false},  // flat error, escaped
		{strings.Replace(fastVLLM, `"created":`, `"error":null,"created":`, 1), false},
		{strings.Replace(fastVLLM, `[{"index"`, `[1,{"index"`, 1), false}, // an element that is not an object
		{strings.Replace(fastVLLM, `"choices":[`, `"choices":[],"choices":[`, 1), false},
		{strings.Replace(fastVLLM, `"choices":[{`, `"choices":{"a":{`, 1) + "}", false},
		{strings.Replace(fastVLLMLP, `"logprobs":{`, `"logprobs":{"content":null,`, 1), true},
		{strings.Replace(fastVLLMLP, `"logprobs":{`, `"logprobs":{"content":[],`, 1), false},
		{strings.Replace(fastVLLMLP, `"content":[{`, `"content":[1,{`, 1), false},
		{strings.Replace(fastVLLM, `"content":" x"`, `"content":" x","content":"y"`, 1), false},
		{strings.Replace(fastVLLM, `"content":" x"`, `"reasoning":" x","reasoning_content":"y"`, 1), false},
		{fastVLLM[:len(fastVLLM)-1], false},                  // truncated
		{fastVLLM + "x", false},                              // trailing bytes
		{strings.Replace(fastVLLM, `461`, `0461`, 1), false}, // invalid number
		{strings.Replace(fastVLLM, `" x"`, "\" \x01\"", 1), false},
	} {
		var a Assembler
		a.Reset(openai.ChatCompletions)
		data := bytes.TrimSpace([]byte(c.chunk))
		took, _ := a.fastChunk(data, false)
		if took != c.take {
			t.Errorf("fastChunk took %v, want %v: %s", took, c.take, c.chunk)
		}
		if took && !gjson.ValidBytes(data) {
			t.Errorf("took invalid JSON %s", c.chunk)
		}
		checkFastSame(t, openai.ChatCompletions, [][]byte{[]byte(c.chunk), []byte(c.chunk)})
	}
}

// TestFastPathBenchStreams: the fast path takes every chunk of the
// benchmarks' streams, and they assemble without allocating per chunk.
func TestFastPathBenchStreams(t *testing.T) {
	for _, logprobs := range []bool{false, true} {
		payloads := streamPayloads(string(benchStreamOf(256, logprobs)))
		var a Assembler
		run := func() {
			a.Reset(openai.ChatCompletions)
			for _, p := range payloads {
				a.AddChunk(p)
			}
			if r := a.Result(); len(r.Choices[0].TokenIDs) != 256 || logprobs != (len(r.Choices[0].Logprobs) == 256) {
				t.Fatalf("%d ids, %d logprobs", len(r.Choices[0].TokenIDs), len(r.Choices[0].Logprobs))
			}
		}
		run()
		if a.nFast != len(payloads)-1 { // all but [DONE]
			t.Errorf("logprobs %v: the fast path took %d of %d chunks", logprobs, a.nFast, len(payloads)-1)
		}
		if n := testing.AllocsPerRun(20, run); n > 2 {
			t.Errorf("logprobs %v: %v allocations per stream, want <= 2", logprobs, n)
		}
		checkFastSame(t, openai.ChatCompletions, payloads)
	}
}

// TestFastPathSameHead: a chunk repeating the previous chunk's head is read
// from after the head, without copying it.
func TestFastPathSameHead(t *testing.T) {
	var a Assembler
	a.Reset(openai.ChatCompletions)
	a.AddChunk([]byte(fastVLLMRole))
	if string(a.head) != fastHead {
		t.Fatalf("head %q", a.head)
	}
	if took, _ := a.fastChunk([]byte(fastVLLMLP), true); !took {
		t.Fatal("a chunk after the head not taken")
	}
	if len(a.tail) != 0 {
		t.Fatal("the chunk was copied")
	}
	checkFastSame(t, openai.ChatCompletions, [][]byte{[]byte(fastVLLMRole), []byte(fastVLLMLP), []byte(fastVLLMEnd), []byte(fastUsage), []byte("[DONE]")})
}

// checkFastSame feeds payloads to two Pendings, one reading chunks through
// the fast path where it can and one always through the general path, and
// fails unless each event has the same effects on both: kept payloads (what
// addChunk returns), Head, and in the end Result and Rows.
func checkFastSame(t *testing.T, endpoint openai.Endpoint, payloads [][]byte) {
	t.Helper()
	fast, slow := AcquirePending(), AcquirePending()
	defer releasePending(fast)
	defer releasePending(slow)
	fast.Endpoint, slow.Endpoint = endpoint, endpoint
	fast.asm.noFast, slow.asm.noFast = false, true
	defer func() { slow.asm.noFast = false }()
	for i, d := range payloads {
		fast.AddEvent(d)
		slow.AddEvent(d)
		// Once the fast path saw a logprobs entry without an id, it keeps
		// nothing (Assembler.noLogprobIDs, checked below); until then both
		// keep the same payloads.
		if fast.asm.noLogprobIDs && len(fast.eventEnds) != 0 {
			t.Fatalf("event %d (%q): %d payloads kept after a logprobs entry without an id", i, d, len(fast.eventEnds))
		}
		if !fast.asm.noLogprobIDs && len(fast.eventEnds) != len(slow.eventEnds) {
			t.Fatalf("event %d (%q): kept %v by the fast path, %v by the general path", i, d, len(fast.eventEnds), len(slow.eventEnds))
		}
		if !bytes.Equal(fast.Head(), slow.Head()) {
			t.Fatalf("event %d (%q): head %q by the fast path, %q by the general path", i, d, fast.Head(), slow.Head())
		}
		if fast.asm.dropped != slow.asm.dropped || fast.asm.droppedT != slow.asm.droppedT || fast.asm.n != slow.asm.n {
			t.Fatalf("event %d (%q): choices differ", i, d)
		}
	}
	if fast.asm.noLogprobIDs {
		// The fallback reading what the general path kept must fail for a
		// choice that is a row: that is what made dropping them right.
		var lp fallback.LogprobIDs
		slow.eachEvent(lp.Add)
		failed := false
		for _, c := range fast.asm.Result().Choices {
			if _, ok := lp.IDs(c.Index); !ok {
				failed = true
			}
		}
		if !failed {
			t.Fatalf("payloads dropped, but the fallback reads ids for every choice from the general path's (choices %v)", lp.Choices())
		}
	} else if !bytes.Equal(fast.events, slow.events) {
		t.Fatal("kept payloads differ")
	}
	if len(payloads) == 0 {
		return
	}
	if msg := diffAssembled(fast.asm.Result(), slow.asm.Result()); msg != "" {
		t.Fatalf("fast path differs: %s", msg)
	}
	var a Assembler
	fr, sr := Rows(fast, &a), Rows(slow, &a)
	if len(fr) != len(sr) {
		t.Fatalf("%d rows by the fast path, %d by the general path", len(fr), len(sr))
	}
	for i := range fr {
		x, y := fr[i], sr[i]
		if x.ResponseBody != y.ResponseBody || x.ResponseMessage != y.ResponseMessage || x.Error != y.Error ||
			!slices.Equal(x.ResponseTokenIDs, y.ResponseTokenIDs) || x.FinishReason != y.FinishReason ||
			x.TokenSource != y.TokenSource || x.TokenCheck != y.TokenCheck {
			t.Fatalf("row %d differs:\n%+v\n%+v", i, x, y)
		}
	}
}

// FuzzFastPath: reading a stream's chunks through the fast path has the
// effects the general path has (checkFastSame), on any input.
func FuzzFastPath(f *testing.F) {
	for _, s := range []string{
		sse(fastVLLMRole, fastVLLMLP, fastVLLMLP, fastVLLMEnd, fastUsage, "[DONE]"),
		sse(fastVLLMRole, fastVLLM, fastVLLMEnd, fastUsage),
		sse(fastSGLang, fastSGLang, strings.Replace(fastSGLang, `"content":"x","reasoning_content":null`, `"content":null,"reasoning_content":"r"`, 1)),
		sse(fastLlama, fastLlama),
		sse(fastCompl, fastComplLP, fastCompl),
		sse(fastTools, strings.Replace(fastTools, `"id":"call_1","type":"function",`, ``, 1)),
		sse(fastN2, fastN2, strings.Replace(fastN2, `"index":1`, `"index":2`, 1)),
		sse(fastVLLMLP, strings.Replace(fastVLLMLP, `"logprob":-1.2`, `"logprob":-0,"logprob":1e400`, 1),
			strings.Replace(fastVLLMLP, `"logprob":-1.2`, `"logprob":"x"`, 1),
			strings.Replace(fastVLLMLP, `"token":" x"`, `"token":"\n\"\\u"`, 1),
			strings.Replace(fastVLLMLP, `"token":" x","logprob":-1.2`, `"token":"\n","logprob":-1.5,"logprob":-2`, 1),
			strings.Replace(fastVLLMLP, `-1.2`, `-123456789012345678901234567890.5e-3`, 1)),
		sse(fastVLLM, strings.Replace(fastVLLM, `"index":0`, `"index":4294967296`, 1),
			strings.Replace(fastVLLM, `"index":0`, `"index":-0`, 1), strings.Replace(fastVLLM, `"index":0`, `"index":1.5`, 1),
			strings.Replace(fastVLLM, `"index":0`, `"index":"1"`, 1)),
		sse(fastVLLM, strings.Replace(fastVLLM, `"created"`, ` "created" `, 1), "  "+fastVLLM, strings.Replace(fastVLLM, `"choices"`, `"extra":1,"choices"`, 1)),
		sse(`{ "choices":[{"delta":{"content":"a"}}]}`, `{ "choices":[{"delta":{"content":"b"}}]}`, `{"choices":[]}`),
	} {
		f.Add([]byte(s), uint8(1))
	}
	f.Add([]byte(sse(fastCompl, fastComplLP)), uint8(0))
	f.Fuzz(func(t *testing.T, in []byte, ep uint8) {
		checkFastSame(t, openai.Endpoint(ep%5), linePayloads(in))
	})
}

// TestParseFloat: parseFloat is strconv.ParseFloat, to the bit.
func TestParseFloat(t *testing.T) {
	check := func(raw string) {
		t.Helper()
		want, _ := strconv.ParseFloat(raw, 64)
		if got := parseFloat(raw); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("parseFloat(%s) = %v, ParseFloat %v", raw, got, want)
		}
	}
	for _, s := range []string{"0", "-0", "-0.0", "1", "-1.2", "0.1", "-9999.999999", "123456789012345", "-12345678901234.5",
		"1234567890123456", "0.000000000000001", "-0.0000000000000001", "1e5", "-1.5E-3", "1e400", "-1e-400", "9007199254740993"} {
		check(s)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		d := r.IntN(16) + 1
		m := r.Uint64N(uint64(math.Pow10(d)))
		s := strconv.FormatUint(m, 10)
		if p := r.IntN(len(s) + 1); p < len(s) {
			s = s[:p] + "." + s[p:]
			if p == 0 {
				s = "0" + s
			}
		}
		if r.IntN(2) == 0 {
			s = "-" + s
		}
		check(s)
	}
}

// FuzzFastPathEdit is FuzzFastPath on regular chunks with one edit: ins
// inserted at pos (and del bytes removed there), so that the fuzzer tries
// small deviations from the shapes the fast path takes (a member added or
// duplicated, an escape, whitespace) without having to find those shapes.
func FuzzFastPathEdit(f *testing.F) {
	for i, ins := range []string{`"id":"y",`, `"index":1,`, `"logprob":-3,`, `"content":"z",`, `"reasoning":"r",`,
		`"error":null,`, `"message":{},`, `"usage":{},`, `"choices":[],`, `\u0041`, " \t", `{},`, `"tool_calls":[{"index":0}],`,
		`"token_logprobs":[1],`, `"object":"error",`, `"prompt_token_ids":[7],`, `"stop_reason":7,`, `"text":"t",`} {
		f.Add(uint8(i), uint16(i*37), uint8(0), []byte(ins))
	}
	f.Fuzz(func(t *testing.T, tmpl uint8, pos uint16, del uint8, ins []byte) {
		chunks := [...]string{fastVLLMLP, fastVLLM, fastVLLMRole, fastVLLMEnd, fastUsage, fastSGLang, fastLlama,
			fastCompl, fastComplLP, fastTools, fastN2}
		c := chunks[int(tmpl)%len(chunks)]
		p := int(pos) % (len(c) + 1)
		q := min(len(c), p+int(del%8))
		edited := c[:p] + string(ins) + c[q:]
		payloads := [][]byte{[]byte(c), []byte(edited), []byte(c), []byte(edited), []byte(fastVLLMEnd)}
		checkFastSame(t, openai.Endpoint(1+tmpl/128), payloads)
	})
}

// TestPendingDropsPayloadsWithoutLogprobIDs: a stream whose logprobs
// entries carry no token id (vLLM without return_tokens_as_token_ids) keeps
// no payload for the token-id fallback once such an entry is seen; entries
// with an "id" (llama.cpp) or a "token_id:NNN" token keep every payload, and
// so do entries whose escapes could spell either.
func TestPendingDropsPayloadsWithoutLogprobIDs(t *testing.T) {
	f := func(entry string, wantKept int) {
		t.Helper()
		p := AcquirePending()
		defer releasePending(p)
		p.Endpoint = openai.ChatCompletions
		chunk := strings.Replace(fastVLLMLP, `{"token":" x","logprob":-1.2,"bytes":[32,120],"top_logprobs":[]}`, entry, 1)
		p.AddEvent([]byte(fastVLLMRole))
		p.AddEvent([]byte(chunk))
		p.AddEvent([]byte(chunk))
		if len(p.eventEnds) != wantKept {
			t.Fatalf("%s: %d payloads kept, want %d", entry, len(p.eventEnds), wantKept)
		}
		checkFastSame(t, openai.ChatCompletions, [][]byte{[]byte(fastVLLMRole), []byte(chunk), []byte(chunk)})
	}
	f(`{"token":" x","logprob":-1.2,"bytes":[32,120],"top_logprobs":[]}`, 0)
	f(`{"token":"token_id:461","logprob":-1.2,"bytes":[32,120],"top_logprobs":[]}`, 2)
	f(`{"id":461,"token":" x","logprob":-1.2,"bytes":[32,120],"top_logprobs":[]}`, 2)
	f(`{"token":"\u0074oken_id:461","logprob":-1.2,"top_logprobs":[]}`, 2)
}
