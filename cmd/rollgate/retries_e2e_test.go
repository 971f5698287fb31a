package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

// sdkTry is one try of sdkCall as the client saw it.
type sdkTry struct {
	status int    // 0: the client gave up (timeout)
	seq    string // x-sequence-id
	span   string // x-request-id
}

// sdkCall posts body as the OpenAI SDKs do with max_retries=1: the first try
// with x-stainless-retry-count 0, and on a timeout or a 5xx one retry with
// the same body and x-stainless-retry-count 1. Every try gives up after
// timeout. headers are sent on every try (name, value, ...).
func sdkCall(t *testing.T, url, body string, timeout time.Duration, headers ...string) []sdkTry {
	t.Helper()
	var tries []sdkTry
	for n := 0; n < 2; n++ {
		req, err := http.NewRequest("POST", url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-stainless-retry-count", strconv.Itoa(n))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := (&http.Client{Timeout: timeout}).Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		var ne interface{ Timeout() bool }
		switch {
		case err != nil && errors.As(err, &ne) && ne.Timeout():
			seq, span := "", ""
			if resp != nil {
				seq, span = resp.Header.Get("x-sequence-id"), resp.Header.Get("x-request-id")
			}
			tries = append(tries, sdkTry{seq: seq, span: span})
			continue
		case err != nil:
			t.Fatalf("try %d: %v", n, err)
		}
		tries = append(tries, sdkTry{resp.StatusCode, resp.Header.Get("x-sequence-id"), resp.Header.Get("x-request-id")})
		if resp.StatusCode < 500 {
			break
		}
	}
	return tries
}

// retryRows waits for n rows of an attempt and returns them ordered as the
// bridge reads them (export.CompareTurns).
func retryRows(t *testing.T, store export.Store, rollout string, n int, logs fmt.Stringer) []export.Call {
	t.Helper()
	rows := tiRows(t, store, rollout, "a", n, logs)
	slices.SortStableFunc(rows, func(a, b export.Call) int { return export.CompareTurns(&a, &b) })
	if len(rows) != n {
		t.Fatalf("%s: %d rows, want %d: %s", rollout, len(rows), n, describeRows(rows))
	}
	return rows
}

// describeRows is rows as the retry table shows them.
func describeRows(rows []export.Call) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "[seq %d try %d of %q: %d %q, %d ids] ", r.SequenceID, r.RetryCount, r.RetryOf, r.HTTPStatus, r.Error, len(r.ResponseTokenIDs))
	}
	return b.String()
}

// TestSDKRetriesAreOneCall: the OpenAI SDKs' retries through the real
// gateway (its built-in mock engine delays or fails only the first try:
// x-mock-first-try-only). A retry keeps its call's sequence id, its row
// says which try it is (retry_count, retry_of = the first try's span id),
// and the bridge trains on the answered try alone, the others excluded as
// superseded_retry, with no air_backend_error charged for a try the agent
// recovered from. A call with an earlier body but no retry header, a retry
// header with an unknown body, or with a body of another attempt, is a new
// call (counted unmatched). The same Idempotency-Key is one call too.
func TestSDKRetriesAreOneCall(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "rollgate.db")
	_, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	base := "http://" + addr
	chat := func(ro, attempt string) string {
		return base + "/rollout/" + ro + "/attempt/" + attempt + "/v1/chat/completions"
	}
	body := func(q string, stream bool) string {
		return fmt.Sprintf(`{"model":"mock","messages":[{"role":"user","content":%q}],"stream":%t,"max_tokens":8}`, q, stream)
	}
	first := []string{"x-mock-first-try-only", "1"}
	type scenario struct {
		ro      string
		body    string
		headers []string
	}
	retried := []scenario{
		{"slow", body("slow, not streamed", false), append(first, "x-mock-ttft-ms", "3000")},
		{"slow-stream", body("slow, streamed", true), append(first, "x-mock-ttft-ms", "3000")},
		{"unavailable", body("503 first", false), append(first, "x-mock-fail", "status=503")},
		{"hang", body("hang first", false), append(first, "x-mock-fail", "hang")},
	}
	for _, sc := range retried {
		tries := sdkCall(t, chat(sc.ro, "a"), sc.body, time.Second, sc.headers...)
		if len(tries) != 2 || tries[1].status != 200 {
			t.Fatalf("%s: tries %+v, want a failed try then 200", sc.ro, tries)
		}
		if tries[1].seq != "1" || tries[0].seq != "" && tries[0].seq != "1" {
			t.Errorf("%s: x-sequence-id of the tries %q, %q; want 1 both", sc.ro, tries[0].seq, tries[1].seq)
		}
	}
	st, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, sc := range retried {
		rows := retryRows(t, st, sc.ro, 2, logs)
		t.Logf("%s: %s", sc.ro, describeRows(rows))
		a, b := rows[0], rows[1]
		if a.SequenceID != 1 || b.SequenceID != 1 {
			t.Errorf("%s: sequence ids %d, %d; want 1, 1 (a retry is the same call): %s", sc.ro, a.SequenceID, b.SequenceID, describeRows(rows))
		}
		if a.RetryCount != 0 || a.RetryOf != "" || b.RetryCount != 1 || b.RetryOf != a.SpanID {
			t.Errorf("%s: tries (%d, %q), (%d, %q); want (0, \"\"), (1, %q)", sc.ro, a.RetryCount, a.RetryOf, b.RetryCount, b.RetryOf, a.SpanID)
		}
		if a.Answered() || !b.Answered() || len(b.ResponseTokenIDs) == 0 {
			t.Errorf("%s: want the first try unanswered and the retry answered with ids: %s", sc.ro, describeRows(rows))
		}
	}

	// Not retries: the same body without the header is a new call; a retry
	// header whose body the attempt never sent, or sent in another attempt,
	// is a new call, counted unmatched.
	q := body("asked twice", false)
	for i, h := range []string{"", "0"} {
		req := []string{}
		if h != "" {
			req = append(req, "x-stainless-retry-count", h)
		}
		if tries := sdkCall(t, chat("twice", "a"), q, 10*time.Second, req...); tries[0].status != 200 || tries[0].seq != strconv.Itoa(i+1) {
			t.Fatalf("twice %d: %+v, want 200 with sequence id %d", i, tries, i+1)
		}
	}
	unmatched := func() float64 { return metricSum(t, addr, `rollgate_retries_total{outcome="unmatched"}`) }
	before := unmatched()
	send := func(ro, attempt, body string, headers ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", chat(ro, attempt), strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("x-sequence-id")
	}
	if status, seq := send("twice", "a", body("never sent", false), "x-stainless-retry-count", "1"); status != 200 || seq != "3" {
		t.Errorf("a retry header with an unknown body: %d, sequence id %s; want 200, 3 (a new call)", status, seq)
	}
	if status, seq := send("twice", "b", q, "x-stainless-retry-count", "1"); status != 200 || seq != "1" {
		t.Errorf("a retry header with another attempt's body: %d, sequence id %s; want 200, 1 (a new call of attempt b)", status, seq)
	}
	if n := unmatched() - before; n != 2 {
		t.Errorf("rollgate_retries_total{outcome=\"unmatched\"} grew by %v, want 2", n)
	}
	// The same Idempotency-Key is the same call, whatever else is sent.
	for i := 0; i < 2; i++ {
		if status, seq := send("idem", "a", body("keyed", false), "Idempotency-Key", "k-1"); status != 200 || seq != "1" {
			t.Errorf("Idempotency-Key try %d: %d, sequence id %s; want 200, 1", i, status, seq)
		}
	}
	if status, seq := send("idem", "a", body("keyed", false), "Idempotency-Key", "k-2"); status != 200 || seq != "2" {
		t.Errorf("another Idempotency-Key: %d, sequence id %s; want 200, 2", status, seq)
	}
	if rows := retryRows(t, st, "twice", 3, logs); rows[0].SequenceID != 1 || rows[1].SequenceID != 2 || rows[2].RetryCount != 0 {
		t.Errorf("twice: %s", describeRows(rows))
	}
	if rows := retryRows(t, st, "idem", 3, logs); rows[1].RetryCount != 1 || rows[1].RetryOf != rows[0].SpanID || rows[2].RetryCount != 0 {
		t.Errorf("idem: %s", describeRows(rows))
	}
	if n := metricSum(t, addr, `rollgate_retries_total{outcome="matched"}`); n != 5 {
		t.Errorf("rollgate_retries_total{outcome=\"matched\"} = %v, want 5 (4 SDK retries, 1 Idempotency-Key)", n)
	}

	// The bridge: one sample per retried call, the answered try's; the
	// unanswered tries excluded as superseded_retry; AIR charges nothing.
	out := filepath.Join(t.TempDir(), "b.jsonl")
	var stdout, stderr bytes.Buffer
	args := []string{"bridge", "--db", db, "--out", out, "--estimator", "none", "--status", "", "--rollouts", "slow,slow-stream,unavailable,hang"}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge: %s", stderr.String())
	}
	t.Logf("bridge: %s", stderr.String())
	samples := readJSONL(t, out)
	byRollout := map[string]int{}
	for _, s := range samples {
		byRollout[s.RolloutID]++
		if !slices.Equal(s.SequenceIDs, []uint64{1}) || len(s.ResponseIDs) == 0 {
			t.Errorf("sample of %s: sequence ids %v, %d response ids; want [1] and ids", s.RolloutID, s.SequenceIDs, len(s.ResponseIDs))
		}
	}
	for _, sc := range retried {
		if byRollout[sc.ro] != 1 {
			t.Errorf("%s: %d samples, want 1 (the answered try)", sc.ro, byRollout[sc.ro])
		}
	}
	if !strings.Contains(stderr.String(), "superseded_retry") {
		t.Errorf("the bridge's summary does not count superseded_retry:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "air_backend_error") {
		t.Errorf("AIR charged air_backend_error for a try the agent recovered from:\n%s", stderr.String())
	}
}
