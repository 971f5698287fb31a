package mock

import (
	"net/http"
	"strings"
	"testing"
)

// TestFirstTryOnly: with x-mock-first-try-only the x-mock-* knobs apply to a
// first try alone (x-stainless-retry-count absent or 0), not to an SDK's
// retry; without it they apply to every try.
func TestFirstTryOnly(t *testing.T) {
	ms, url, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	f := func(firstOnly bool, retry string, want int) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
		req.Header.Set("x-mock-fail", "status=503")
		if firstOnly {
			req.Header.Set("x-mock-first-try-only", "1")
		}
		if retry != "" {
			req.Header.Set("x-stainless-retry-count", retry)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("first-try-only %v, retry count %q: %d, want %d", firstOnly, retry, resp.StatusCode, want)
		}
	}
	f(true, "", 503)
	f(true, "0", 503)
	f(true, "1", 200)
	f(true, "junk", 503)
	f(false, "1", 503)
}
