package load

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	cases := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.999, 7 * time.Millisecond},
		{"median of 4 is the 2nd", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p90 of 1..100", ms(hundred...), 0.90, 90 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"p99.9 of 1..100 is the max", ms(hundred...), 0.999, 100 * time.Millisecond},
		{"q above 1 clamps", ms(1, 2), 2, 2 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.q); got != tc.want {
				t.Fatalf("Percentile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
	p := Summarize(ms(4, 1, 3, 2))
	if p.N != 4 || p.P50 != 2000 || p.Max != 4000 || p.Mean != 2500 {
		t.Fatalf("Summarize: %+v", p)
	}
}

func TestParseProc(t *testing.T) {
	stat := []byte("1234 (nginx: worker) S 1 1234 1234 0 -1 4194624 100 0 0 0 250 75 0 0 20 0 1 0 100 1000 50\n")
	got, err := parseStat(stat)
	if err != nil || got != 325 {
		t.Fatalf("parseStat = %d, %v; want 325", got, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 a b"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
	hwm, err := parseHWM([]byte("Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    5120 kB\nVmRSS:\t 100 kB\n"))
	if err != nil || hwm != 5120 {
		t.Fatalf("parseHWM = %d, %v", hwm, err)
	}
	if _, err := parseHWM([]byte("Name:\tx\n")); err == nil {
		t.Error("parseHWM without VmHWM: no error")
	}
	// This process: its CPU time only grows, its peak RSS is positive.
	s, err := Snapshot([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.Since(1000)
	if err != nil {
		t.Fatal(err)
	}
	if u.PeakRSSMiB <= 0 || u.CPUSeconds < 0 || len(u.PIDs) == 0 {
		t.Fatalf("usage of self: %+v", u)
	}
	if _, err := Snapshot([]int{-1}); err == nil {
		t.Fatal("Snapshot of a missing process: no error")
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (a b) S 1 1 1 0 -1 0 0 0 0 0 3 4 0 0"))
	f.Add([]byte("1 (a)) R"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseStat(b)
		_, _ = parseHWM(b)
	})
}

func TestReadStream(t *testing.T) {
	body := "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\n" +
		"data: [DONE]\n\n"
	var c Call
	c.CompletionTokens = -1
	m, err := readStream(strings.NewReader(body), time.Now(), &c)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].ID != "call_1" || m.ToolCalls[0].Function.Name != "get_weather" ||
		m.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` {
		t.Fatalf("tool calls: %+v", m.ToolCalls)
	}
	if c.CompletionTokens != 9 || c.TTFT <= 0 {
		t.Fatalf("call: %+v", c)
	}
	for name, bad := range map[string]string{
		"huge tool index": "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":100000000}]}}]}\n\ndata: [DONE]\n\n",
		"no DONE":         "data: {\"choices\":[]}\n\n",
		"not JSON":        "data: {\"choices\n\ndata: [DONE]\n\n",
	} {
		if _, err := readStream(strings.NewReader(bad), time.Now(), &Call{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":3}]}}]}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Call
		_, _ = readStream(bytes.NewReader(b), time.Now(), &c)
		_, _ = readJSON(bytes.NewReader(b), &c)
	})
}

// fakeStore answers every read of calls with fixed rows.
type fakeStore struct {
	export.Store
	rows []export.Call
	err  error
	rng  export.RolloutRange
}

func (f *fakeStore) CallChecks(_ context.Context, r export.RolloutRange) ([]export.CallCheck, error) {
	f.rng = r
	var out []export.CallCheck
	for _, r := range f.rows {
		out = append(out, export.CallCheck{SpanID: r.SpanID, RolloutID: r.RolloutID, AttemptID: r.AttemptID, SequenceID: r.SequenceID,
			TokenSource: r.TokenSource, TokenCheck: r.TokenCheck, CompletionTokens: r.CompletionTokens, ResponseTokens: len(r.ResponseTokenIDs)})
	}
	return out, f.err
}

func TestVerifyCounts(t *testing.T) {
	res := &Result{Config: Config{RunID: "run1"}}
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		res.Calls = append(res.Calls, Call{RolloutID: "run1-r1", AttemptID: "1", Status: 200, RequestID: id,
			SequenceID: itoa(i + 1), CompletionTokens: 2})
	}
	res.Calls = append(res.Calls,
		Call{RolloutID: "run1-r2", AttemptID: "1", Status: 500, Err: "HTTP 500", RequestID: "f"},
		Call{RolloutID: "run1-r3", AttemptID: "1", Status: 200})
	row := func(span string, seq uint64) export.Call {
		return export.Call{SpanID: span, RolloutID: "run1-r1", AttemptID: "1", SequenceID: seq,
			TokenSource: export.TokenSourceEngine, CompletionTokens: 2, ResponseTokenIDs: []uint32{1, 2}}
	}
	bad := row("c", 3)
	bad.TokenSource = export.TokenSourceNone
	wrongSeq := row("d", 9)
	failed := row("f", 1)
	failed.RolloutID = "run1-r2"
	store := &fakeStore{rows: []export.Call{row("a", 1), row("a", 1), bad, wrongSeq, failed}}
	c, err := Verify(context.Background(), store, res, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := Capture{Expected: 5, Found: 3, Missing: 2, Duplicate: 1, BadTokens: 1, Mismatch: 1, NoRequestID: 1, Extra: 1}
	c.WaitedSec, c.Examples = 0, nil
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("Verify = %+v\nwant     %+v", *c, want)
	}
	if c.OK() {
		t.Fatal("OK with missing rows")
	}
	if want := (export.RolloutRange{From: "run1-", To: "run1."}); store.rng != want {
		t.Errorf("the read does not select the run's rollouts: %+v, want %+v", store.rng, want)
	}
	res.Config.RunID = "x'; DROP TABLE llm_calls; --"
	if _, err := Verify(context.Background(), store, res, 0); err == nil {
		t.Fatal("unsafe run id accepted")
	}
	res.Config.RunID = "run1"
	store.err = errors.New("boom")
	if _, err := Verify(context.Background(), store, res, 0); err == nil {
		t.Fatal("store error not reported")
	}
}

func TestTable(t *testing.T) {
	rep := func(label string, thr, p50, p99 float64, cpu float64) *Report {
		return &Report{Label: label, Scenario: "json", Throughput: thr,
			Latency: Percentiles{P50: p50, P99: p99}, Proc: &ProcUsage{CPUPer1000: cpu, PeakRSSMiB: 20}}
	}
	var b bytes.Buffer
	Table(&b, []*Report{
		rep("direct", 1000, 100, 300, 0.1), rep("direct", 1200, 120, 500, 0.1), rep("direct", 1100, 110, 400, 0.1),
		rep("rollgate", 800, 150, 450, 0.3),
	}, "direct")
	out := b.String()
	for _, want := range []string{
		"| json | direct | 3 | 1100 | 1.00 | 110µs | +0µs | 400µs | +0µs |",
		"| json | rollgate | 1 | 800 | 0.73 | 150µs | +40µs | 450µs | +50µs |",
		"| 0.300 | 20 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestReadReports(t *testing.T) {
	in := `{"label":"direct","scenario":"json","throughput_rps":10,"latency":{"p50_us":5}}

{"label":"rollgate","scenario":"json","capture":{"expected":3,"found":3}}
`
	reps, err := ReadReports(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].Latency.P50 != 5 || reps[1].Capture.Found != 3 || reps[1].Label != "rollgate" {
		t.Fatalf("reports: %+v %+v", reps[0], reps[1])
	}
	if _, err := ReadReports(strings.NewReader(in + "{oops")); err == nil {
		t.Fatal("malformed line accepted")
	}
}

func itoa(n int) string {
	return string(rune('0' + n))
}

// TestSystemPrompt: --system-bytes pads the system message to about that
// size, as text that JSON has to escape; 0 leaves the one-line instruction.
func TestSystemPrompt(t *testing.T) {
	base := systemPrompt(0)
	if base == "" || systemPrompt(10) != base {
		t.Fatalf("short prompt %q", base)
	}
	for _, n := range []int{1000, 100_000} {
		p := systemPrompt(n)
		if len(p) < n || len(p) > n+200 || !strings.HasPrefix(p, base) || !strings.Contains(p, `"weather"`) {
			t.Fatalf("systemPrompt(%d): %d bytes", n, len(p))
		}
	}
}

// TestReturnTokenIDs: --return-token-ids puts return_token_ids in every
// request body (a direct run then asks the engine for what rollgate asks),
// and nothing of it is sent without the flag.
func TestReturnTokenIDs(t *testing.T) {
	var bodies []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"completion_tokens":1}}`)
	}))
	defer srv.Close()
	for _, ids := range []bool{true, false} {
		bodies = bodies[:0]
		res, err := Run(context.Background(), Config{BaseURL: srv.URL, PathStyle: PathPlain, Agents: 1, Turns: 2, Rollouts: 1, ReturnTokenIDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		if rep := res.Summary(); rep.OK != 2 || rep.Errors != 0 {
			t.Fatalf("ids=%v: report %+v", ids, rep)
		}
		for _, b := range bodies {
			if got := gjson.Get(b, "return_token_ids"); got.Exists() != ids || (ids && got.Raw != "true") {
				t.Fatalf("ids=%v: request body %s", ids, b)
			}
		}
	}
}
