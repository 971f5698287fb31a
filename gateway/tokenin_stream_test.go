package gateway

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/gateway/tokenin"
)

// FuzzTokenInStreamChunk: whatever an engine's derender and generate chunks
// hold (a hostile engine), the chat chunk parts the gateway writes are
// valid JSON and the answer it assembles for the next call never panics.
func FuzzTokenInStreamChunk(f *testing.F) {
	f.Add(`{"role":"assistant","content":"Hi","reasoning":null}`, `[{"token_id":5,"logprob":-0.5,"top_logprobs":[{"token_id":5,"logprob":-0.5}]}]`, 1)
	f.Add(`{"content":null,"tool_calls":[{"id":"c1","type":"function","index":0,"function":{"name":"add","arguments":null}},{"id":null,"index":0,"function":{"arguments":"{\"a\":"}}]}`, `null`, 0)
	f.Add(`{"tool_calls":[{"index":7,"function":{"name":5,"arguments":["x"]}}],"reasoning":"think \u0000"}`, `[{"token_id":-1,"logprob":"x"}]`, 3)
	f.Fuzz(func(t *testing.T, delta, logprobs string, top int) {
		p := &tokenInPump{topLogprobs: top, tc: tokenInStreamCall{put: func([]tokenin.Choice) {}}, ch: make([]pumpChoice, 1)}
		out := appendDelta(nil, gjson.Parse(delta), &p.ch[0])
		if !gjson.ValidBytes(out) {
			t.Fatalf("delta %s gave invalid JSON %s", delta, out)
		}
		out = p.appendLogprobs(nil, gjson.Result{}, gjson.Parse(logprobs))
		if !gjson.ValidBytes(out) {
			t.Fatalf("logprobs %s gave invalid JSON %s", logprobs, out)
		}
		p.ch[0].done = true
		p.remember()
	})
}
