package ui

import (
	"context"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// TestUnattributedAndRolloutRewards: calls captured without a rollout
// (rollout_id ”) are listed as (unattributed) with a link that opens
// them, and an episode reward posted without attempt_id (as the README's
// first run posts it) shows on the rollout page and in the list, as the
// trainer bridge counts it.
func TestUnattributedAndRolloutRewards(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		const t0 = uint64(1_900_000_000_000_000_000)
		call := func(ro, at string, seq uint64) export.Call {
			return export.Call{SpanID: "u-" + ro + "-" + at, RolloutID: ro, AttemptID: at, SequenceID: seq, StartTimeUnixNano: t0 + seq,
				EndTimeUnixNano: t0 + seq + 10, HTTPStatus: 200, Endpoint: "/v1/chat/completions", Model: "m",
				RequestBody: `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`, ResponseMessage: `{"role":"assistant","content":"hi"}`,
				TokenSource: export.TokenSourceNone, FinishReason: "stop"}
		}
		b := &export.Batch{Calls: []export.Call{call("", "", 1), call("demo", "1", 1)},
			Rewards: []export.Reward{{RolloutID: "demo", Name: "primary", Value: 0.75, Source: "api", TimeUnixNano: t0 + 100}}}
		if err := s.Write(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		base := serve(t, s, Config{})
		code, list := get(t, base+"/ui")
		if code != 200 || !strings.Contains(list, `href="/ui/rollouts/%28unattributed%29"`) || !strings.Contains(list, ">(unattributed)</a>") {
			t.Fatalf("list: %d, no (unattributed) row linking to its page: %.2000s", code, list)
		}
		row := list[strings.Index(list, `data-rollout="demo"`):]
		row = row[:strings.Index(row, "</tr>")]
		if !strings.Contains(row, ">0.75<") {
			t.Errorf("the list does not show demo's reward posted without attempt_id: %s", row)
		}
		code, page := get(t, base+"/ui/rollouts/%28unattributed%29")
		if code != 200 || !strings.Contains(page, `id="unattributed-note"`) || !strings.Contains(page, "hello there") {
			t.Errorf("the unattributed calls' page: %d %.1500s", code, page)
		}
		if code, _ := get(t, base+"/ui/rollouts/(unattributed)/calls/1/raw"); code != 200 {
			t.Errorf("an unattributed call's raw page: %d", code)
		}
		_, page = get(t, base+"/ui/rollouts/demo")
		ep := page[strings.Index(page, `id="episode-rewards"`):]
		ep = ep[:strings.Index(ep, "</dd>")]
		if !strings.Contains(ep, "primary = 0.75") {
			t.Errorf("demo's episode reward posted without attempt_id is not shown: %s", ep)
		}
	})
}
