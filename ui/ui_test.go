package ui

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
)

var serverDSN string

func TestMain(m *testing.M) { testenv.Main(m, &serverDSN) }

const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>`

// fixture writes group g1 of three rollouts (ro-a succeeded with reward 1,
// ro-b succeeded with reward 0 and a truncated, hostile answer, ro-c failed
// with calls without logprobs), a rollout of another task whose id and
// task need quoting, and a long call for paging.
func fixture(t *testing.T, s export.Store) {
	t.Helper()
	b := &export.Batch{}
	const t0 = uint64(1_800_000_000_000_000_000)
	call := func(ro, task string, seq uint64, at uint64, msgs, reply string) export.Call {
		return export.Call{SpanID: fmt.Sprintf("%s-%d", ro, seq), RolloutID: ro, AttemptID: "a1", TaskID: task, AgentName: "coder",
			SequenceID: seq, StartTimeUnixNano: at, EndTimeUnixNano: at + 2_500_000, TTFTNano: 700_000, HTTPStatus: 200,
			Endpoint: "/v1/chat/completions", Model: "m", Backend: "r0", PolicyVersion: "3",
			RequestBody: `{"model":"m","messages":[` + msgs + `]}`, ResponseMessage: reply,
			PromptTokenIDs: []uint32{1, 2, 3}, ResponseTokenIDs: []uint32{4, 5, 6}, ResponseLogprobs: []float32{-0.01, -2.5, -6},
			TokenSource: export.TokenSourceEngine, FinishReason: "stop", PromptTokens: 3, CompletionTokens: 3, TurnKind: "first"}
	}
	sys := `{"role":"system","content":"solve it"},{"role":"user","content":"2+2?"}`
	tc := `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"calc","arguments":"{\"x\":\"2+2\"}"}}]}`
	for i, ro := range []string{"ro-a", "ro-b", "ro-c"} {
		at := t0 + uint64(i)*1_000_000_000
		c1 := call(ro, "task1", 1, at, sys, tc)
		c2 := call(ro, "task1", 2, at+100_000_000, sys+`,`+tc+`,{"role":"tool","tool_call_id":"c1","content":"4"}`, `{"role":"assistant","content":"four"}`)
		c2.PromptTokenIDs = []uint32{1, 2, 3, 4, 5, 6, 7, 8}
		c2.TurnKind, c2.TurnPrefixLen, c2.TurnPrevSequenceID = "prefix", 6, 1
		switch ro {
		case "ro-b":
			c2.ResponseMessage = `{"role":"assistant","content":` + jsonString(hostile) + `}`
			c2.FinishReason = "length"
			c2.TurnKind, c2.TurnPrefixLen = "edited", 2
		case "ro-c":
			c1.ResponseLogprobs, c2.ResponseLogprobs = nil, nil
			c2.HTTPStatus, c2.Error = 502, "upstream: bad gateway"
		}
		b.Calls = append(b.Calls, c1, c2)
		status := map[string]string{"ro-a": "succeeded", "ro-b": "succeeded", "ro-c": "failed"}[ro]
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a1", TaskID: "task1", GroupID: "g1", Status: status,
			Metadata: "{}", CreatedUnixNano: at, UpdatedUnixNano: at + 200_000_000})
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: "a1", Name: "primary", Value: map[string]float64{"ro-a": 1, "ro-b": 0, "ro-c": 0.25}[ro], Source: "api", TimeUnixNano: at + 300_000_000})
	}
	b.Rewards = append(b.Rewards, export.Reward{RolloutID: "ro-b", AttemptID: "a1", SequenceID: 2, Name: "primary", Value: -0.1, Source: "api", TimeUnixNano: t0})
	b.Calls[1].PromptTokenSource, b.Calls[1].ResponseTokenSource = export.TokenSourceEngine, export.TokenSourceNone // ro-a call 2: only the prompt side verified
	odd := call(`ro'q\x`, `t'x\`, 1, t0+10_000_000_000, sys, `{"role":"assistant","content":"ok"}`)
	odd.TokenSource, odd.PromptTokenIDs, odd.ResponseTokenIDs, odd.ResponseLogprobs = export.TokenSourceNone, nil, nil, nil
	odd.AgentName, odd.PolicyVersion = "reviewer", "4"
	long := call("ro-long", "task2", 1, t0+20_000_000_000, sys, `{"role":"assistant","content":"long"}`)
	long.ResponseTokenIDs, long.ResponseLogprobs = make([]uint32, 5000), make([]float32, 5000)
	for i := range long.ResponseTokenIDs {
		long.ResponseTokenIDs[i] = uint32(i % 300)
	}
	b.Calls = append(b.Calls, odd, long)
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

func jsonString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// stores runs f on the embedded store and on ClickHouse, each filled by fixture.
func stores(t *testing.T, f func(t *testing.T, s export.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		s, err := sqlite.Open(filepath.Join(t.TempDir(), "ui.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		fixture(t, s)
		f(t, s)
	})
	t.Run("clickhouse", func(t *testing.T) {
		ctx := context.Background()
		dsn := testenv.FreshDatabase(serverDSN, "t_"+t.Name())
		if err := testenv.DropDatabase(ctx, dsn); err != nil {
			t.Fatal(err)
		}
		s, err := clickhouse.Open(ctx, dsn, clickhouse.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		fixture(t, s)
		f(t, s)
	})
}

// sqliteFixture is an embedded store holding fixture, closed with the test.
func sqliteFixture(t *testing.T) export.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "ui.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fixture(t, s)
	return s
}

// serve starts the viewer of s on a loopback port and returns its base URL.
func serve(t testing.TB, s export.Store, cfg Config) string {
	t.Helper()
	v, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: v.Handle}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, u string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Security-Policy"); !strings.Contains(ct, "default-src 'none'") {
		t.Errorf("GET %s: Content-Security-Policy %q", u, ct)
	}
	return resp.StatusCode, string(b)
}

var (
	rowRe  = regexp.MustCompile(`<tr data-rollout="([^"]*)">`)
	nextRe = regexp.MustCompile(`id="next-page" href="([^"]*)"`)
)

// rowsOf lists the rollout ids of a list page, in order (HTML-unescaped).
func rowsOf(body string) []string {
	var out []string
	for _, m := range rowRe.FindAllStringSubmatch(body, -1) {
		out = append(out, htmlUnescape(m[1]))
	}
	return out
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&#39;", "'", "&#34;", `"`, "&amp;", "&", "&lt;", "<", "&gt;", ">", "&quot;", `"`).Replace(s)
}

func TestList(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		base := serve(t, s, Config{})
		code, body := get(t, base+"/ui")
		if code != 200 {
			t.Fatalf("GET /ui: %d %s", code, body)
		}
		want := []string{"ro-long", `ro'q\x`, "ro-c", "ro-b", "ro-a"}
		if got := rowsOf(body); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("rows %q, want %q (newest activity first)", got, want)
		}
		// ro-a's row: reward 1, 2 calls, 6+11 tokens, no errors, 2/2 verified ids.
		row := rowHTML(t, body, "ro-a")
		for _, w := range []string{`href="/ui/groups/g1"`, `s-succeeded`, `>1<`, `>2<`, `6 / 6`, `>2/2<`} {
			if !strings.Contains(row, w) {
				t.Errorf("ro-a row lacks %q: %s", w, row)
			}
		}
		if row := rowHTML(t, body, "ro-c"); !strings.Contains(row, `num bad">1<`) || !strings.Contains(row, "s-failed") {
			t.Errorf("ro-c row should show 1 error and failed: %s", row)
		}
		if row := rowHTML(t, body, `ro&#39;q\x`); !strings.Contains(row, `num bad">0/1<`) || !strings.Contains(row, "unregistered") {
			t.Errorf("odd row should flag 0/1 verified ids: %s", row)
		}
		filters := map[string][]string{
			"task=" + url.QueryEscape(`t'x\`):         {`ro'q\x`},
			"group=g1":                                {"ro-c", "ro-b", "ro-a"},
			"status=failed":                           {"ro-c"},
			"agent=reviewer":                          {`ro'q\x`},
			"policy=3&task=task1":                     {"ro-c", "ro-b", "ro-a"},
			"since=2027-01-15T08:00:10Z":              {"ro-long", `ro'q\x`},
			"until=2027-01-15T08:00:01Z":              {"ro-a"},
			"task=nothing":                            nil,
			"group=" + url.QueryEscape(`' OR 1=1 --`): nil,
		}
		for q, want := range filters {
			code, body := get(t, base+"/ui/rollouts?"+q)
			if got := rowsOf(body); code != 200 || strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("?%s: %d rows %q, want %q", q, code, got, want)
			}
		}
		// the live refresh's fragment holds only the rows
		if _, frag := get(t, base+"/ui/rollouts?part=rows&group=g1"); !strings.HasPrefix(frag, `<tbody id="rollout-rows">`) || len(rowsOf(frag)) != 3 {
			t.Errorf("rows fragment: %.200s", frag)
		}
		for _, bad := range []string{"since=yesterday", "before=x", "before=18446744073709551615", "task=" + strings.Repeat("x", 600), "task=%ff"} {
			if code, body := get(t, base+"/ui/rollouts?"+bad); code != 400 || !strings.Contains(body, "Bad filter") {
				t.Errorf("?%.40s: %d, want 400 with a reason", bad, code)
			}
		}
	})
}

// rowHTML returns the table row of rollout id (as escaped in the page).
func rowHTML(t *testing.T, body, id string) string {
	t.Helper()
	i := strings.Index(body, `<tr data-rollout="`+id+`">`)
	if i < 0 {
		t.Fatalf("no row for %s", id)
	}
	j := strings.Index(body[i:], "</tr>")
	return body[i : i+j]
}

func TestListPaging(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		base := serve(t, s, Config{PageSize: 2})
		var all []string
		u := base + "/ui/rollouts?task=task1"
		for range 5 {
			_, body := get(t, u)
			all = append(all, rowsOf(body)...)
			m := nextRe.FindStringSubmatch(body)
			if m == nil {
				break
			}
			u = base + htmlUnescape(m[1])
		}
		if want := "ro-c|ro-b|ro-a"; strings.Join(all, "|") != want {
			t.Fatalf("pages gave %q, want %s once each", all, want)
		}
	})
}

func TestRolloutPage(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		base := serve(t, s, Config{})
		code, body := get(t, base+"/ui/rollouts/ro-b")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Fatal("captured text reached the page unescaped")
		}
		i1, i2 := strings.Index(body, `id="call-1"`), strings.Index(body, `id="call-2"`)
		if i1 < 0 || i2 < i1 {
			t.Fatalf("calls not in sequence order (%d, %d)", i1, i2)
		}
		call2 := body[i2:]
		for _, w := range []string{"&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;", "Trajectory merge breaks here (edited, compared with #1: 2 leading ids match)",
			`title="step reward">primary = -0.1`, "AIR air_truncated = -0.5", `tag bad">length`, "result of c1", "TTFT 700µs", "2.5ms total", "⇢ r0", "v3"} {
			if !strings.Contains(call2, w) {
				t.Errorf("call 2 lacks %q", w)
			}
		}
		// call 2 shows only what is new: the assistant's tool call and the tool result, not the system prompt again
		if strings.Count(body, "solve it") != 1 {
			t.Errorf("the system prompt is shown %d times, want once", strings.Count(body, "solve it"))
		}
		if !strings.Contains(body[i1:i2], `<span class="tool">calc</span>`) {
			t.Error("call 1's tool call is not shown")
		}
		if _, b := get(t, base+"/ui/rollouts/ro-c"); !strings.Contains(b, "upstream: bad gateway") || !strings.Contains(b, `class="call failed"`) {
			t.Error("ro-c's failed call is not shown as failed with its error")
		}
		if _, b := get(t, base+"/ui/rollouts/ro-a"); !strings.Contains(b, "prompt ids: engine · response ids: none") {
			t.Error("ro-a's call 2 does not show each side's id source")
		}
		code, body = get(t, base+"/ui/rollouts/"+url.PathEscape(`ro'q\x`))
		if code != 200 || !strings.Contains(body, "Rollout ro&#39;q\\x") {
			t.Errorf("odd id: %d %.300s", code, body)
		}
	})
}

func TestTokensPage(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		base := serve(t, s, Config{})
		code, body := get(t, base+"/ui/rollouts/ro-a/calls/2?max_response=2")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		if n := strings.Count(body, `class="tok masked obs"`) - 1; n != 2 { // - the legend's
			t.Errorf("%d new-observation tokens, want 2 (prompt ids 6..7 after the 6-id prefix)", n)
		}
		if n := strings.Count(body, `class="tok masked"`) - 1; n != 6 { // - the legend's
			t.Errorf("%d context tokens, want 6", n)
		}
		for _, w := range []string{`class="tok gen lp0"`, `class="tok gen lp5"`, `class="tok gen lp7 cut"`, `id="cut-point"`, "logprob -2.5000", "No decoder configured"} {
			if !strings.Contains(body, w) {
				t.Errorf("tokens page lacks %q", w)
			}
		}
		resp := body[strings.Index(body, `id="response-tokens"`):]
		if strings.Index(resp, `id="cut-point"`) > strings.Index(resp, `data-id="6"`) || !strings.Contains(resp, `id="cut-point"`) {
			t.Error("the cut mark is not before the third response token")
		}
		_, body = get(t, base+"/ui/rollouts/ro-long/calls/1")
		const legend = 5 // the legend's spans
		if n := strings.Count(body, `class="tok gen`) - legend; n != tokensPerPage {
			t.Errorf("long response: %d token spans, want a page of %d", n, tokensPerPage)
		}
		if !strings.Contains(body, "roff=2000") {
			t.Error("long response: no link to the next page of tokens")
		}
		_, body = get(t, base+"/ui/rollouts/ro-long/calls/1?roff=4000")
		if n := strings.Count(body, `class="tok gen`) - legend; n != 1000 {
			t.Errorf("last page: %d tokens, want 1000", n)
		}
	})
}

func TestGroupPage(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		base := serve(t, s, Config{})
		code, body := get(t, base+"/ui/groups/g1?estimator=grpo&air=off")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		member := func(id string) string {
			i := strings.Index(body, `data-rollout="`+id+`"`)
			if i < 0 {
				t.Fatalf("no member %s", id)
			}
			j := strings.Index(body[i:], "</section>")
			return body[i : i+j]
		}
		// Scores: the episode reward plus the step rewards (identical
		// credit): ro-a 1, ro-b 0 - 0.1 (its step reward), ro-c 0.25 (no sample
		// left, but its score counts in the group). GRPO: (s - mean) /
		// (unbiased std + 1e-6), as verl.
		scores := map[string]float64{"ro-a": 1, "ro-b": -0.1, "ro-c": 0.25}
		mean := (1 - 0.1 + 0.25) / 3
		var ss float64
		for _, v := range scores {
			ss += (v - mean) * (v - mean)
		}
		std := math.Sqrt(ss / 2)
		for _, id := range []string{"ro-a", "ro-b"} {
			m := member(id)
			if !strings.Contains(m, `class="score" data-value="`+fmtFloat(scores[id])+`"`) {
				t.Errorf("%s: score %v not shown: %s", id, scores[id], m)
			}
			adv := regexp.MustCompile(`class="advantage" data-value="([-0-9.e]+)"`).FindStringSubmatch(m)
			want := (scores[id] - mean) / (std + 1e-6)
			if adv == nil {
				t.Errorf("%s: no advantage: %s", id, m)
			} else if got, _ := strconv.ParseFloat(adv[1], 64); math.Abs(got-want) > 1e-9 {
				t.Errorf("%s: advantage %v, want %v", id, got, want)
			}
		}
		if m := member("ro-b"); strings.Contains(m, "air_") {
			t.Errorf("ro-b: AIR hits shown with AIR off: %s", m)
		}
		// With AIR on (the bridge's default), ro-b's cut answer hits
		// air_truncated (-0.5 by default) and its score drops by that.
		_, body = get(t, base+"/ui/groups/g1")
		if m := member("ro-b"); !strings.Contains(m, "air_truncated ×1") {
			t.Errorf("ro-b: AIR hit missing: %s", m)
		}
		if m := member("ro-c"); !strings.Contains(m, "no_logprobs") || !strings.Contains(m, "errored") {
			t.Errorf("ro-c: exclusion reasons missing: %s", m)
		}
		if code, _ := get(t, base+"/ui/groups/g1?estimator=bogus"); code != 400 {
			t.Errorf("bogus estimator: %d, want 400", code)
		}
		if code, _ := get(t, base+"/ui/groups/g1?mode=bogus"); code != 400 {
			t.Errorf("bogus estimator: %d, want 400", code)
		}
	})
}

func TestNotFoundAndAuth(t *testing.T) {
	s := sqliteFixture(t)
	base := serve(t, s, Config{})
	for _, p := range []string{"/ui/rollouts/nope", "/ui/groups/nope", "/ui/rollouts/ro-a/calls/9", "/ui/rollouts/ro-a/calls/x", "/ui/elsewhere", "/ui/static/../ui.go"} {
		code, body := get(t, base+p)
		if code != 404 || !strings.Contains(body, `id="error-message"`) {
			t.Errorf("GET %s: %d, want a 404 page: %.200s", p, code, body)
		}
	}
	if code, _ := get(t, base+"/ui/rollouts/"+url.PathEscape(hostile)); code != 404 {
		t.Errorf("hostile id: %d", code)
	}
	req, _ := http.NewRequest("POST", base+"/ui", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 405 {
		t.Errorf("POST /ui: %v %v, want 405", resp, err)
	}
	locked := serve(t, s, Config{AdminToken: "s3cret"})
	if code, _ := get(t, locked+"/ui"); code != 401 {
		t.Errorf("no token: %d, want 401", code)
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("me:s3cret"))
	for _, h := range []string{"Bearer s3cret", basic} {
		if code, _ := get(t, locked+"/ui", "Authorization", h); code != 200 {
			t.Errorf("%s: %d, want 200", h, code)
		}
	}
	if code, body := get(t, locked+"/ui", "Authorization", "Bearer wrong"); code != 401 || strings.Contains(body, "s3cret") {
		t.Errorf("wrong token: %d", code)
	}
}

// TestRoutesServed requests every route of Routes on the fixture.
func TestRoutesServed(t *testing.T) {
	s := sqliteFixture(t)
	base := serve(t, s, Config{})
	fill := strings.NewReplacer("{rollout_id}", "ro-a", "{sequence_id}", "1", "{group_id}", "g1", "{file...}", "ui.css")
	for _, r := range Routes() {
		m, p := r.Method, r.Pattern
		if m != "GET" {
			t.Errorf("route %s: the viewer is read-only", r)
		}
		if code, body := get(t, base+fill.Replace(p)); code != 200 {
			t.Errorf("GET %s: %d %.200s", fill.Replace(p), code, body)
		}
	}
}
