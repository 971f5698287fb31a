package controlplane

import (
	"encoding/json"
	"testing"
)

// FuzzReportedCall: any body either is refused with a reason or becomes a
// row whose stored JSON fields are valid JSON and whose ids agree with the
// token source.
func FuzzReportedCall(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"response":"hello","prompt_token_ids":[1,2],"response_token_ids":[3],"token_source":"engine"}`,
		`{"prompt":"2+2=","response":{"role":"assistant","content":"4"},"reward":1}`,
		`{"request":{"model":"m","messages":[]},"response":"x","response_token_ids":[1,2],"response_logprobs":[-1,-2]}`,
		`{"messages":[],"response":"\xff\xfe"}`,
		`{"messages":null,"response":""}`,
		`{"response":{"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{"}}]},"messages":[]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var rc reportedCall
		if strictJSON(body, &rc) != nil {
			return
		}
		c, msg := reportedToCall(&rc, 1)
		if msg != "" {
			return
		}
		if !json.Valid([]byte(c.RequestBody)) || !json.Valid([]byte(c.ResponseMessage)) || !json.Valid([]byte(c.ResponseBody)) {
			t.Fatalf("stored invalid JSON: %q %q %q", c.RequestBody, c.ResponseMessage, c.ResponseBody)
		}
		if c.TokenSource != "none" && len(c.ResponseTokenIDs) == 0 {
			t.Fatalf("token_source %q without ids", c.TokenSource)
		}
		if len(c.ResponseLogprobs) > 0 && len(c.ResponseLogprobs) != len(c.ResponseTokenIDs) {
			t.Fatalf("%d logprobs for %d ids", len(c.ResponseLogprobs), len(c.ResponseTokenIDs))
		}
	})
}
