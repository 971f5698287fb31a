package gateway

import "testing"

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
