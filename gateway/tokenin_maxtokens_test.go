package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/gateway"
)

// TestTokenInKeepsMaxTokens16: vLLM 0.32's render leaves a max_tokens of 16
// (SamplingParams' default, omitted by msgspec) out of its answer, and
// generate then runs to the context's end; the mock does the same. Through
// token-in, a call with max_tokens 16 and a 40-token natural answer must
// still stop at 16 tokens, streamed or not, whichever field names the limit.
func TestTokenInKeepsMaxTokens16(t *testing.T) {
	store, _ := openSQLite(t)
	e := newEnvWith(t, store, mock.Config{ScaleOut: true, EndOfTurn: true}, func(c *gateway.Config) { c.TokenIn = true })
	client := &http.Client{Timeout: 30 * time.Second}
	for _, c := range []struct{ name, limit, stream string }{
		{"max_tokens", `"max_tokens":16`, ""},
		{"max_completion_tokens", `"max_completion_tokens":16`, ""},
		{"streamed", `"max_tokens":16`, `,"stream":true,"stream_options":{"include_usage":true}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"user","content":"Tell me a long story"}],` + c.limit + c.stream + `}`
			req, _ := http.NewRequest("POST", e.url+"/rollout/mt16-"+c.name+"/attempt/a/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("x-mock-tokens", "40")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			usage, finish := gjson.GetBytes(b, "usage"), gjson.GetBytes(b, "choices.0.finish_reason").Str
			if c.stream != "" {
				for _, line := range strings.Split(string(b), "\n") {
					data, ok := strings.CutPrefix(line, "data: ")
					if !ok || data == "[DONE]" {
						continue
					}
					if u := gjson.Get(data, "usage"); u.IsObject() {
						usage = u
					}
					if f := gjson.Get(data, "choices.0.finish_reason").Str; f != "" {
						finish = f
					}
				}
			}
			if got := usage.Get("completion_tokens").Int(); got != 16 || finish != "length" {
				t.Fatalf("completion_tokens %d, finish %q; want 16, length\n%s", got, finish, b)
			}
		})
	}
}
