package agl_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// eventPage reads one page of a rollout's events: the events, and the
// X-Rollgate-Next-After header ("" on the last page).
func (e *aglEnv) eventPage(t *testing.T, rollout, query string) ([]gjson.Result, string) {
	t.Helper()
	r := e.do(t, "GET", "/api/rollouts/"+rollout+"/events"+query, "", 200)
	if !gjson.ValidBytes(r.Body) || !gjson.ParseBytes(r.Body).IsArray() {
		t.Fatalf("GET events%s: not a JSON array: %.300s", query, r.Body)
	}
	return gjson.ParseBytes(r.Body).Array(), r.Header.Get("X-Rollgate-Next-After")
}

// pageAll follows X-Rollgate-Next-After from after=0 with ?limit=limit
// (and the extra query), and returns every event it read, in order.
func (e *aglEnv) pageAll(t *testing.T, rollout, extra string, limit int) []string {
	t.Helper()
	var out []string
	after := "0"
	for pages := 0; after != ""; pages++ {
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		evs, next := e.eventPage(t, rollout, "?after="+after+"&limit="+strconv.Itoa(limit)+extra)
		if len(evs) == 0 || len(evs) > limit {
			t.Fatalf("page after=%s limit=%d: %d events", after, limit, len(evs))
		}
		for _, ev := range evs {
			out = append(out, ev.Raw)
		}
		if next != "" && next != strconv.Itoa(len(out)) {
			t.Fatalf("page after=%s: X-Rollgate-Next-After %s, want %d", after, next, len(out))
		}
		after = next
	}
	return out
}

func raws(evs []gjson.Result) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Raw
	}
	return out
}

// TestAGLEventPages: GET /api/rollouts/{id}/events pages with ?after= and
// ?limit= (X-Rollgate-Next-After names the next page until the last):
// an empty rollout, pages that end exactly at the last event, after beyond
// the end, the byte bound of a page (an event larger than it comes alone),
// pages of a filtered and of a triplet list, and bad values (422 naming
// the parameter); without either parameter every event comes, as AGL's
// clients expect.
func TestAGLEventPages(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newAGL(t, open(t), "")
		e.registerMock(t, 1)
		e.do(t, "POST", "/api/rollouts", `[{"input":{},"rollout_id":"empty"},{"input":{},"rollout_id":"r1"}]`, 201)

		for _, q := range []string{"", "?limit=1", "?after=0&limit=10000", "?after=5"} {
			if evs, next := e.eventPage(t, "empty", q); len(evs) != 0 || next != "" {
				t.Fatalf("empty rollout%s: %d events, next %q", q, len(evs), next)
			}
		}

		// 7 events: posted ones around two calls (the same prompt twice: the
		// triplet view keeps the second).
		e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"running","last_attempt_id":"0"}}`, 200)
		post := func(typ, data string) {
			e.do(t, "POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"`+typ+`","data":`+data+`}`, 200)
		}
		post("a", `{"n":1}`)
		post("a", `{"n":2}`)
		e.do(t, "POST", "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions", chatBody, 200)
		post("big", `{"pad":"`+strings.Repeat("p", 5000)+`"}`)
		e.do(t, "POST", "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions", chatBody, 200)
		post("a", `{"n":3}`)
		post("reward", `{"value":1}`)

		all, next := e.eventPage(t, "r1", "")
		if len(all) != 7 || next != "" {
			t.Fatalf("every event: %d, next %q", len(all), next)
		}
		var types []string
		for _, ev := range all {
			types = append(types, ev.Get("event_type").String())
		}
		if got := strings.Join(types, ","); got != "a,a,model_request,big,model_request,a,reward" {
			t.Fatalf("event order: %s", got)
		}
		want := strings.Join(raws(all), "\n")
		for _, limit := range []int{1, 3, 6, 7, 10000} {
			if got := strings.Join(e.pageAll(t, "r1", "", limit), "\n"); got != want {
				t.Fatalf("pages of %d differ from the whole list:\n%s\nwant\n%s", limit, got, want)
			}
		}
		if evs, next := e.eventPage(t, "r1", "?after=4&limit=3"); len(evs) != 3 || next != "" || evs[0].Raw != all[4].Raw {
			t.Fatalf("a page that ends at the last event: %d events, next %q", len(evs), next)
		}
		if evs, next := e.eventPage(t, "r1", "?after=3&limit=3"); len(evs) != 3 || next != "6" || evs[0].Raw != all[3].Raw {
			t.Fatalf("after=3&limit=3: %d events, next %q", len(evs), next)
		}
		for _, after := range []string{"7", "8", "9223372036854775807"} {
			if evs, next := e.eventPage(t, "r1", "?after="+after); len(evs) != 0 || next != "" {
				t.Fatalf("after=%s (beyond the end): %d events, next %q", after, len(evs), next)
			}
		}

		// Filters first, then positions: pages of the "a" events and of the
		// triplets are the filtered lists.
		if got, whole := e.pageAll(t, "r1", "&event_type=a", 2), raws(e.events(t, "r1", "?event_type=a")); len(whole) != 3 || strings.Join(got, "\n") != strings.Join(whole, "\n") {
			t.Fatalf("pages of event_type=a: %v, want %v", got, whole)
		}
		trip := raws(e.events(t, "r1", "?format=triplet"))
		if len(trip) != 6 || gjson.Get(trip[3], "event_type").String() != "model_request" || !gjson.Get(trip[3], "data.prompt_token_ids").IsArray() {
			t.Fatalf("triplets: %v", trip)
		}
		if got := e.pageAll(t, "r1", "&format=triplet", 1); strings.Join(got, "\n") != strings.Join(trip, "\n") {
			t.Fatalf("pages of triplets: %v, want %v", got, trip)
		}

		// The byte bound: a page stops once its events' data reach it, and
		// an event larger than it comes alone; a request without after or
		// limit (AGL's) still gets every event.
		defer agl.SetMaxEventPageBytes(agl.SetMaxEventPageBytes(10))
		if evs, next := e.eventPage(t, "r1", "?after=0&limit=3"); len(evs) != 2 || next != "2" {
			t.Fatalf("two events of 7 bytes with a bound of 10: %d events, next %q", len(evs), next)
		}
		if evs, next := e.eventPage(t, "r1", "?after=3&limit=3"); len(evs) != 1 || next != "4" || evs[0].Get("event_type").String() != "big" {
			t.Fatalf("an event larger than the bound: %d events, next %q", len(evs), next)
		}
		if got := strings.Join(e.pageAll(t, "r1", "", 10000), "\n"); got != want {
			t.Fatalf("pages under the byte bound differ from the whole list:\n%s", got)
		}
		if evs, next := e.eventPage(t, "r1", ""); len(evs) != 7 || next != "" {
			t.Fatalf("without after or limit: %d events, next %q", len(evs), next)
		}

		for q, field := range map[string]string{"?after=-1": "after", "?after=x": "after", "?after=1.5": "after", "?limit=0": "limit",
			"?limit=10001": "limit", "?limit=-3": "limit", "?limit=": "limit", "?after=0&limit=99999999999999999999": "limit"} {
			r := e.do(t, "GET", "/api/rollouts/r1/events"+q, "", 422)
			if loc := gjson.GetBytes(r.Body, "detail.0.loc").Raw; loc != `["query","`+field+`"]` {
				t.Errorf("%s: loc %s, want query.%s: %s", q, loc, field, r.Body)
			}
		}
		if r := e.do(t, "GET", "/api/rollouts/r1/events?limit=10001", "", 422); !strings.Contains(string(r.Body), "less than or equal to 10000") {
			t.Errorf("limit=10001: the range is not named: %s", r.Body)
		}
		e.do(t, "GET", "/api/rollouts/nope/events?after=0", "", 404)
	})
}
