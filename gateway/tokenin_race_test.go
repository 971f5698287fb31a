package gateway_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// TestTokenInStreamsConcurrently (meant for -race): streamed token-in calls
// of 8 attempts at once, each followed by an extending streamed call, and
// 4 clients that leave mid-stream, in one gateway process: every finished
// attempt's second call is extended, every left stream's generate ends.
func TestTokenInStreamsConcurrently(t *testing.T) {
	store, _ := openSQLite(t)
	e := newEnvWith(t, store, mock.Config{ScaleOut: true, EndOfTurn: true}, func(c *gateway.Config) { c.TokenIn = true })
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(path, body, knob string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", e.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if knob != "" {
			req.Header.Set("x-mock-itl-ms", knob)
		}
		return client.Do(req)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			path := fmt.Sprintf("/rollout/race-%d/attempt/a/v1/chat/completions", i)
			first := `[{"role":"user","content":"Hi ` + fmt.Sprint(i) + `"}]`
			resp, err := post(path, `{"model":"m","messages":`+first+`,"max_tokens":200,"stream":true}`, "")
			if err != nil {
				t.Error(err)
				return
			}
			var content strings.Builder
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if c := gjsonContent(sc.Text()); c != "" {
					content.WriteString(c)
				}
			}
			resp.Body.Close()
			next := strings.TrimSuffix(first, "]") + `,{"role":"assistant","content":` + fmt.Sprintf("%q", content.String()) + `},{"role":"user","content":"More"}]`
			resp, err = post(path, `{"model":"m","messages":`+next+`,"max_tokens":200,"stream":true}`, "")
			if err != nil {
				t.Error(err)
				return
			}
			for sc = bufio.NewScanner(resp.Body); sc.Scan(); {
			}
			resp.Body.Close()
		})
	}
	for i := range 4 {
		wg.Go(func() {
			resp, err := post(fmt.Sprintf("/rollout/leave-%d/attempt/a/v1/chat/completions", i), `{"model":"m","messages":[{"role":"user","content":"Long"}],"max_tokens":400,"stream":true}`, "50")
			if err != nil {
				t.Error(err)
				return
			}
			br := bufio.NewReader(resp.Body)
			for n := 0; n < 3; {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Error(err)
					return
				}
				if strings.HasPrefix(line, "data: ") {
					n++
				}
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	testenv.WaitFor(t, 10*time.Second, func() string { return fmt.Sprintf("%d mock streams still open", e.mock.ActiveStreams()) },
		func() bool { return e.mock.ActiveStreams() == 0 })
	extended := 0
	for i := range 8 {
		var rows []export.Call
		testenv.WaitFor(t, 10*time.Second, func() string { return fmt.Sprintf("race-%d: %d rows", i, len(rows)) }, func() bool {
			rows = e.storedCalls(export.CallFilter{RolloutID: fmt.Sprintf("race-%d", i)})
			return len(rows) == 2
		})
		got := map[string]bool{rows[0].TokenIn: true, rows[1].TokenIn: true}
		if got["extended"] {
			extended++
		}
		if !got["first"] || !(got["extended"] || got["whole:not_ended"]) {
			t.Errorf("race-%d: token_in %q, %q; want first, then extended (or whole:not_ended after a cut answer)", i, rows[0].TokenIn, rows[1].TokenIn)
		}
	}
	if extended == 0 {
		t.Error("no second call was extended")
	}
	t.Logf("%d of 8 second calls extended", extended)
}

// gjsonContent returns the content delta of an SSE data line, or "".
func gjsonContent(line string) string {
	data, ok := strings.CutPrefix(line, "data: ")
	if !ok || data == "[DONE]" {
		return ""
	}
	return gjson.Get(data, "choices.0.delta.content").String()
}
