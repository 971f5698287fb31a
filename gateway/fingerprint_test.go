package gateway

import (
	"bytes"
	"testing"
)

// TestFingerprintHold: from the first finish chunk on, events are held in
// order until the usage chunk; then each finish chunk gets the usage
// chunk's system_fingerprint as its last member, as vLLM 0.32.0 writes it
// when the client did not ask for usage. Without a usage chunk (or without
// a fingerprint in it) the held events go out as they are.
func TestFingerprintHold(t *testing.T) {
	const (
		c0  = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n"
		f0  = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
		c1  = "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"b\\\"finish_reason\\\":\\\"x\"},\"finish_reason\":null}]}\n\n"
		f1  = "data: {\"choices\":[{\"index\":1,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
		fp  = `,"system_fingerprint":"vllm-0.32.0-35c1713a"`
		use = `{"choices":[],"usage":{"prompt_tokens":1},"system_fingerprint":"vllm-0.32.0-35c1713a"}`
	)
	data := func(ev string) []byte { return []byte(ev[len("data: ") : len(ev)-2]) }
	f := func(on bool, usage []byte, want string) {
		t.Helper()
		var h fpHold
		h.reset(on)
		var out []byte
		for _, ev := range []string{c0, f0, c1, f1} {
			if !h.add([]byte(ev), data(ev)) {
				out = append(out, ev...)
			}
		}
		out = h.release(out, usage)
		if string(out) != want || h.holding() {
			t.Fatalf("on=%v usage=%s\n got %q\nwant %q", on, usage, out, want)
		}
	}
	plain := c0 + f0 + c1 + f1
	f(false, []byte(use), plain)
	f(true, nil, plain)
	f(true, []byte(`{"choices":[],"usage":{}}`), plain)
	f(true, []byte(use), c0+f0[:len(f0)-3]+fp+"}\n\n"+c1+f1[:len(f1)-3]+fp+"}\n\n")
}

// FuzzHasFinish: hasFinish is bytes.Contains(data, finishKey).
func FuzzHasFinish(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"delta":{"content":"b\"finish_reason\":\"x"},"finish_reason":null}`,
		`finish_reason":"`, `"finish_reason":"`, `x"finish_reason":`, `""finish_reason":"finish_reason":"`,
		`ffinish_reason":"finish_reason":"`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := hasFinish(data), bytes.Contains(data, []byte(finishKey)); got != want {
			t.Fatalf("hasFinish(%q) = %v, bytes.Contains says %v", data, got, want)
		}
	})
}

// BenchmarkHasFinish: a token chunk of the mock vLLM stream (ids and
// logprobs injected), which has no finish; the old search was
// bytes.Contains.
func BenchmarkHasFinish(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-1de9ee33683964a972eec0ca61bb9dd0","object":"chat.completion.chunk","created":1700000000,"model":"mock-model",` +
		`"choices":[{"index":0,"delta":{"content":" bright"},"logprobs":{"content":[{"token":" bright","logprob":-0.041,"bytes":[32,98,114,105,103,104,116],"top_logprobs":[]}]},` +
		`"finish_reason":null,"token_ids":[17432]}]}`)
	b.Run("hasFinish", func(b *testing.B) {
		for b.Loop() {
			if hasFinish(chunk) {
				b.Fatal("found a finish")
			}
		}
	})
	b.Run("bytes.Contains", func(b *testing.B) {
		for b.Loop() {
			if bytes.Contains(chunk, []byte(finishKey)) {
				b.Fatal("found a finish")
			}
		}
	})
}
