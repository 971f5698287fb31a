package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// resumeMock starts a mock vLLM with the token-in endpoints whose
// generations run long (natural length 10,000 tokens, itl apart), so that
// calls are mid-generation when the drill pauses. seed stands for the
// weights: another seed samples other ids.
func resumeMock(t *testing.T, seed uint64, itl time.Duration, maxModelLen int) (*mock.Server, string) {
	t.Helper()
	ms, url, err := mock.Start(mock.Config{ScaleOut: true, EndOfTurn: true, ITL: itl, MaxTokens: 10000, Seed: seed, MaxModelLen: maxModelLen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Shutdown() })
	return ms, url
}

// resumeAdmin sends an /api/v1 request and returns the answer, failing on
// a status other than 200.
func resumeAdmin(t *testing.T, addr, method, path, body string) gjson.Result {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, b)
	}
	return gjson.ParseBytes(b)
}

// resumeTable is a PUT /api/v1/backends body: mock-model on url, serving
// policy version.
func resumeTable(url, version string) string {
	return fmt.Sprintf(`{"backends":[{"model":"mock-model","replicas":[{"url":%q,"kind":"vllm","policy_version":%q}]}]}`, url, version)
}

// resumeAgent is one streaming client: its stream's bytes and how many
// chunks it has read so far.
type resumeAgent struct {
	body   []byte
	err    error
	chunks atomic.Int64
}

// run posts a streamed chat call to mock-model and reads its stream to
// the end.
func (a *resumeAgent) run(addr, rollout string, maxTokens int) {
	a.runModel(addr, "mock-model", rollout, maxTokens, "")
}

// runModel is run for model, with extra members appended to the body.
func (a *resumeAgent) runModel(addr, model, rollout string, maxTokens int, extra string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Tell me the story of %s"}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},"logprobs":true%s}`, model, rollout, maxTokens, extra)
	resp, err := http.Post("http://"+addr+"/rollout/"+rollout+"/attempt/a/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		a.err = err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		a.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
		return
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		a.body = append(a.body, line...)
		if strings.HasPrefix(string(line), "data: ") {
			a.chunks.Add(1)
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			a.err = err
			return
		}
	}
}

// resumeGateway starts a --token-in gateway on a SQLite store whose
// routing table serves model from upstream under policy version v0.
func resumeGateway(t *testing.T, upstream, model string) (addr, db string, logs *syncBuffer) {
	t.Helper()
	addr, db = freeAddr(t), filepath.Join(t.TempDir(), "resume.db")
	_, logs = start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--upstream", upstream, "--upstream-kind", "vllm", "--token-in")
	resumeAdmin(t, addr, "PUT", "/api/v1/backends", strings.ReplaceAll(resumeTable(upstream, "v0"), "mock-model", model))
	return addr, db, logs
}

// startAgents starts n agents, agent i running run(i, a), and returns them
// and the group that waits for them.
func startAgents(n int, run func(i int, a *resumeAgent)) ([]*resumeAgent, *sync.WaitGroup) {
	as := make([]*resumeAgent, n)
	var wg sync.WaitGroup
	for i := range as {
		as[i] = &resumeAgent{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(i, as[i])
		}()
	}
	return as, &wg
}

// allRead says whether every agent has read at least from[i]+n chunks
// (from nil: n).
func allRead(as []*resumeAgent, from []int64, n int64) bool {
	for i, a := range as {
		base := int64(0)
		if from != nil {
			base = from[i]
		}
		if a.chunks.Load() < base+n {
			return false
		}
	}
	return true
}

// resumeUsage returns the completion_tokens of a stream's usage chunk.
func resumeUsage(b []byte) int64 {
	for _, line := range strings.Split(string(b), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if u := gjson.Get(data, "usage.completion_tokens"); ok && u.Exists() && len(gjson.Get(data, "choices").Array()) == 0 {
			return u.Int()
		}
	}
	return -1
}

// TestResumeDrill: 16 agents stream 150-token answers (a token every 15 ms)
// through a --token-in gateway; three times mid-generation the trainer
// pauses in mode abort, waits for the drain (no call in flight, 16 streams
// parked), replaces the routing table with the other mock (another seed:
// other weights) under the next policy version, and resumes. Every client
// stream completes without an error event, with one finish reason
// ("length": 150 tokens) and usage of 150 completion tokens; the text each
// client received is the concatenation of its row's segments' texts
// (policy_versions boundaries over the response ids) with nothing repeated
// or missing; each row's policy_versions is [[0,"v0"],[k1,"v1"],[k2,"v2"],
// [k3,"v3"]] with 0 < k1 < k2 < k3 < 150, and it has one logprob per id.
func TestResumeDrill(t *testing.T) {
	const agents, maxTokens, cycles = 16, 150, 3
	msA, urlA := resumeMock(t, 1, 15*time.Millisecond, 0)
	msB, urlB := resumeMock(t, 2, 15*time.Millisecond, 0)
	mocks, urls := []*mock.Server{msA, msB}, []string{urlA, urlB}
	addr, db, logs := resumeGateway(t, urlA, "mock-model")
	as, wg := startAgents(agents, func(i int, a *resumeAgent) { a.run(addr, fmt.Sprintf("drill-%02d", i), maxTokens) })
	// progressed waits until every agent has read at least n more chunks
	// than it had in from.
	progressed := func(from []int64, n int64, what string) {
		testenv.WaitFor(t, 30*time.Second, func() string {
			return fmt.Sprintf("agents did not progress %s\n%s", what, logs)
		}, func() bool { return allRead(as, from, n) })
	}
	counts := func() []int64 {
		out := make([]int64, agents)
		for i, a := range as {
			out[i] = a.chunks.Load()
		}
		return out
	}
	progressed(nil, 5, "before the first pause")
	for cycle := 1; cycle <= cycles; cycle++ {
		from, to := mocks[(cycle-1)%2], mocks[cycle%2]
		paused := time.Now()
		v := resumeAdmin(t, addr, "POST", "/api/v1/pause?mode=abort", "")
		if v.Get("mode").Str != "abort" {
			t.Fatalf("cycle %d: pause answered %s, want mode abort", cycle, v.Raw)
		}
		testenv.WaitFor(t, 30*time.Second, func() string {
			return fmt.Sprintf("cycle %d: not drained: %s; the old mock streams %d\n%s", cycle, resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain").Raw, from.ActiveStreams(), logs)
		}, func() bool {
			d := resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain")
			return d.Get("drained").Bool() && d.Get("parked_streams").Int() == agents && from.ActiveStreams() == 0
		})
		drained := time.Since(paused)
		at := counts()
		resumeAdmin(t, addr, "PUT", "/api/v1/backends", resumeTable(urls[cycle%2], fmt.Sprintf("v%d", cycle)))
		resumed := time.Now()
		resumeAdmin(t, addr, "POST", "/api/v1/resume", "")
		testenv.WaitFor(t, 30*time.Second, func() string {
			return fmt.Sprintf("cycle %d: %d of %d streams resumed on the new mock\n%s", cycle, to.ActiveStreams(), agents, logs)
		}, func() bool { return to.ActiveStreams() == agents })
		t.Logf("cycle %d: pause(abort) to drained with %d streams parked %v; resume to all %d generating on the new replica %v", cycle, agents, drained.Round(time.Millisecond), agents, time.Since(resumed).Round(time.Millisecond))
		if cycle < cycles {
			progressed(at, 3, fmt.Sprintf("after resume %d", cycle))
		}
	}
	wg.Wait()
	wantResumes(t, addr, map[string]float64{"aborted": agents * cycles, "resumed": agents * cycles, "finished": 0, "failed": 0})

	store := resumeStore(t, db)
	for i, a := range as {
		rollout := fmt.Sprintf("drill-%02d", i)
		if a.err != nil {
			t.Fatalf("%s: %v\n%s", rollout, a.err, logs)
		}
		msg, finish := tiReadStream(t, a.body) // fails on an error event, a second finish, no [DONE]
		if finish != "length" || resumeUsage(a.body) != maxTokens {
			t.Errorf("%s: finish %q, usage completion_tokens %d; want length, %d", rollout, finish, resumeUsage(a.body), maxTokens)
		}
		row := tiRows(t, store, rollout, "a", 1, logs)[0]
		var segs [][2]json.RawMessage
		if err := json.Unmarshal([]byte(row.PolicyVersions), &segs); err != nil || len(segs) != cycles+1 {
			t.Fatalf("%s: policy_versions %q (%v), want %d segments", rollout, row.PolicyVersions, err, cycles+1)
		}
		ids := row.ResponseTokenIDs
		if len(ids) != maxTokens || len(row.ResponseLogprobs) != maxTokens || row.PolicyVersion != "v0" {
			t.Fatalf("%s: %d response ids, %d logprobs, policy_version %q; want %d, %d, v0", rollout, len(ids), len(row.ResponseLogprobs), row.PolicyVersion, maxTokens, maxTokens)
		}
		var text strings.Builder
		prev := -1
		for k, sg := range segs {
			var start int
			var version string
			if json.Unmarshal(sg[0], &start) != nil || json.Unmarshal(sg[1], &version) != nil || version != fmt.Sprintf("v%d", k) || start <= prev || (k == 0) != (start == 0) || start >= len(ids) {
				t.Fatalf("%s: policy_versions %s: segment %d is not [start > previous, \"v%d\"]", rollout, row.PolicyVersions, k, k)
			}
			end := len(ids)
			if k+1 < len(segs) {
				_ = json.Unmarshal(segs[k+1][0], &end)
			}
			text.WriteString(mock.Decode(ids[start:end]))
			prev = start
		}
		if i == 0 {
			t.Logf("%s: policy_versions %s, %d ids, text %q", rollout, row.PolicyVersions, len(ids), msg.Content)
		}
		if msg.Content != text.String() {
			t.Errorf("%s: the client received\n%q\nthe segments' texts are\n%q", rollout, msg.Content, text.String())
		}
	}
}

// TestResumeCannotContinue: a generation aborted by a pause in mode abort
// whose resume finds the engine unable to continue (the new replica's
// context is shorter than prompt + generated + the remaining max_tokens:
// HTTP 400) ends the client's stream with an SSE error event and [DONE];
// the row keeps the ids generated before the pause and its error says at
// which response token the resume failed and why.
func TestResumeCannotContinue(t *testing.T) {
	msA, urlA := resumeMock(t, 1, 15*time.Millisecond, 0)
	_, urlC := resumeMock(t, 2, 15*time.Millisecond, 100)
	addr, db, logs := resumeGateway(t, urlA, "mock-model")
	a := &resumeAgent{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.run(addr, "short", 150)
	}()
	testenv.WaitFor(t, 30*time.Second, func() string { return "the stream did not start\n" + logs.String() }, func() bool { return a.chunks.Load() >= 5 })
	resumeAdmin(t, addr, "POST", "/api/v1/pause?mode=abort", "")
	testenv.WaitFor(t, 30*time.Second, func() string { return "not parked\n" + logs.String() }, func() bool {
		return resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain.parked_streams").Int() == 1 && msA.ActiveStreams() == 0
	})
	resumeAdmin(t, addr, "PUT", "/api/v1/backends", resumeTable(urlC, "v1"))
	resumeAdmin(t, addr, "POST", "/api/v1/resume", "")
	<-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	body := string(a.body)
	errEv := ""
	for _, line := range strings.Split(body, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && gjson.Get(data, "error.message").Exists() {
			errEv = gjson.Get(data, "error.message").Str
		}
	}
	if !strings.Contains(errEv, "resuming at response token") || !strings.Contains(errEv, "maximum context length") || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") {
		t.Fatalf("the stream's error event %q (want the resume's token index and the engine's context error), then [DONE]:\n%s", errEv, body)
	}
	wantResumes(t, addr, map[string]float64{"aborted": 1, "resumed": 0, "finished": 0, "failed": 1})
	row := tiRows(t, resumeStore(t, db), "short", "a", 1, logs)[0]
	n := len(row.ResponseTokenIDs)
	if n == 0 || n >= 150 || !strings.Contains(row.Error, fmt.Sprintf("resuming at response token %d:", n)) || row.PolicyVersions != "" {
		t.Errorf("row: %d response ids, error %q, policy_versions %q; want the ids before the pause, an error naming token %d, no second segment", n, row.Error, row.PolicyVersions, n)
	}
}

// wantResumes checks rollgate_token_in_resumes_total{outcome} on the
// gateway at addr against want.
func wantResumes(t *testing.T, addr string, want map[string]float64) {
	t.Helper()
	for outcome, n := range want {
		if got := metricSum(t, addr, `rollgate_token_in_resumes_total{outcome="`+outcome+`"}`); got != n {
			t.Errorf("rollgate_token_in_resumes_total{outcome=%q} = %v, want %v", outcome, got, n)
		}
	}
}

// TestResumeKeepsTraceContext: a streamed generation resumed after a pause
// in mode abort goes to the new replica with the trace context
// (traceparent, tracestate) its first generate request carried, so the
// engine's spans of both segments join the agent's trace; the client's
// request is gone by the time of the resume.
func TestResumeKeepsTraceContext(t *testing.T) {
	const traceparent, tracestate = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "rojo=00f067aa0ba902b7"
	msA, urlA := resumeMock(t, 1, 15*time.Millisecond, 0)
	msB, urlB := resumeMock(t, 2, 15*time.Millisecond, 0)
	addr, _, logs := resumeGateway(t, urlA, "mock-model")
	var chunks atomic.Int64
	done := make(chan error, 1)
	go func() {
		body := `{"model":"mock-model","messages":[{"role":"user","content":"Tell me the story of traced"}],"max_tokens":150,"stream":true}`
		req, _ := http.NewRequest("POST", "http://"+addr+"/rollout/traced/attempt/a/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", tracestate)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadBytes('\n')
			if strings.HasPrefix(string(line), "data: ") {
				chunks.Add(1)
			}
			if err != nil {
				done <- nil
				return
			}
		}
	}()
	testenv.WaitFor(t, 30*time.Second, func() string { return "the stream did not start\n" + logs.String() }, func() bool { return chunks.Load() >= 5 })
	first := [2]string{msA.LastGenerateHeader("traceparent"), msA.LastGenerateHeader("tracestate")}
	if first[0] == "" || first[0][3:35] != traceparent[3:35] {
		t.Fatalf("the first generate request's traceparent %q: not the agent's trace %s", first[0], traceparent[3:35])
	}
	resumeAdmin(t, addr, "POST", "/api/v1/pause?mode=abort", "")
	testenv.WaitFor(t, 30*time.Second, func() string { return "not parked\n" + logs.String() }, func() bool {
		return resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain.parked_streams").Int() == 1 && msA.ActiveStreams() == 0
	})
	resumeAdmin(t, addr, "PUT", "/api/v1/backends", resumeTable(urlB, "v1"))
	resumeAdmin(t, addr, "POST", "/api/v1/resume", "")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if msB.RequestsTo(mock.PathGenerate) != 1 {
		t.Fatalf("%d generate requests reached the new replica, want 1 (the resume)\n%s", msB.RequestsTo(mock.PathGenerate), logs)
	}
	if got := [2]string{msB.LastGenerateHeader("traceparent"), msB.LastGenerateHeader("tracestate")}; got != first {
		t.Errorf("the resumed generate request carried traceparent %q, tracestate %q; the first carried %q, %q", got[0], got[1], first[0], first[1])
	}
}

// resumeStore opens the gateway's SQLite database for reading.
func resumeStore(t *testing.T, db string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestEnginePausePassThrough: POST /api/v1/pause?engine=keep calls vLLM's
// own /pause?mode=keep on the replica (the mock in dev mode): a stream
// under way freezes (no chunk while paused) and goes on after POST
// /api/v1/resume, which calls the engine's /resume; a replica without the
// dev-mode routes is reported with the fix; an unknown engine mode is 400
// naming every kind's modes and pauses nothing.
func TestEnginePausePassThrough(t *testing.T) {
	ms, url, err := mock.Start(mock.Config{ScaleOut: true, EndOfTurn: true, ITL: 10 * time.Millisecond, MaxTokens: 10000, DevMode: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ms.Shutdown() }()
	_, plain := resumeMock(t, 2, 0, 0)
	addr, _, logs := resumeGateway(t, url, "mock-model")
	isPaused := func() bool {
		r, err := http.Get(strings.TrimSuffix(url, "/v1") + "/is_paused")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return gjson.GetBytes(b, "is_paused").Bool()
	}

	req, _ := http.NewRequest("POST", "http://"+addr+"/api/v1/pause?engine=sometimes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "vllm: abort|wait|keep") || !strings.Contains(string(b), "sglang: abort|retract|in_place") ||
		resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain.paused").Bool() {
		t.Fatalf("an unknown engine mode: HTTP %d %s (want 400 naming the modes, the gateway not paused)", resp.StatusCode, b)
	}

	a := &resumeAgent{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.run(addr, "frozen", 120)
	}()
	testenv.WaitFor(t, 30*time.Second, func() string { return "the stream did not start\n" + logs.String() }, func() bool { return a.chunks.Load() >= 3 })
	v := resumeAdmin(t, addr, "POST", "/api/v1/pause?engine=keep", "")
	if e := v.Get("engines.0"); e.Get("status").Int() != 200 || e.Get("mode").Str != "keep" || e.Get("kind").Str != "vllm" || !isPaused() {
		t.Fatalf("pause answered %s; the engine paused: %v", v.Raw, isPaused())
	}
	testenv.WaitFor(t, 5*time.Second, func() string { return "the engine's generation did not freeze between two tokens" }, func() bool {
		return ms.Frozen() == 1
	})
	frozen := a.chunks.Load()
	v = resumeAdmin(t, addr, "POST", "/api/v1/resume", "")
	if v.Get("engines.0.status").Int() != 200 || isPaused() {
		t.Fatalf("resume answered %s; the engine paused: %v", v.Raw, isPaused())
	}
	<-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if _, finish := tiReadStream(t, a.body); finish != "length" || a.chunks.Load() <= frozen {
		t.Errorf("after the resume: finish %q, %d chunks (%d when frozen)", finish, a.chunks.Load(), frozen)
	}

	// A replica without vLLM's dev-mode routes.
	resumeAdmin(t, addr, "PUT", "/api/v1/backends", resumeTable(plain, "v1"))
	v = resumeAdmin(t, addr, "POST", "/api/v1/pause?engine=abort", "")
	if e := v.Get("engines.0"); e.Get("status").Int() != 404 || !strings.Contains(e.Get("error").Str, "VLLM_SERVER_DEV_MODE=1") {
		t.Errorf("pause on an engine without /pause answered %s", v.Raw)
	}
	if v = resumeAdmin(t, addr, "POST", "/api/v1/resume", ""); v.Get("engines").Exists() {
		t.Errorf("resume called engines that were not paused: %s", v.Raw)
	}
}

// TestResumeRealVLLM is the drill against the real vLLM 0.32 (SmolLM2,
// --enable-scale-out, VLLM_SERVER_DEV_MODE=1): four streaming agents
// (ignore_eos, 256 tokens) are paused in mode abort with the engine's own
// pause in mode keep too, mid-generation; the routing table is replaced by
// the same engine under policy version v1, and the resume continues every
// stream: no error event, one finish, the usage's 256 completion tokens;
// each row has 256 response ids and logprobs, policy_versions
// [[0,"v0"],[k,"v1"]] for the streams the abort caught, and the text the
// client received is vLLM's own /detokenize of those ids.
func TestResumeRealVLLM(t *testing.T) {
	t.Setenv("VLLM_SERVER_DEV_MODE", "1")
	v, err := testenv.StartVLLM()
	if err != nil {
		t.Fatalf("TestResumeRealVLLM needs a real vLLM (set %s, or let testenv.StartVLLM start one): %v", testenv.EnvVLLMURL, err)
	}
	t.Cleanup(v.Stop)
	const agents, maxTokens = 4, 256
	addr, db, logs := resumeGateway(t, v.URL, testenv.VLLMModel)
	as, wg := startAgents(agents, func(i int, a *resumeAgent) {
		a.runModel(addr, testenv.VLLMModel, fmt.Sprintf("real-%d", i), maxTokens, `,"ignore_eos":true,"temperature":0.7,"seed":`+fmt.Sprint(i))
	})
	testenv.WaitFor(t, 2*time.Minute, func() string { return "the streams did not start\n" + logs.String() }, func() bool { return allRead(as, nil, 8) })
	pausedAt := time.Now()
	p := resumeAdmin(t, addr, "POST", "/api/v1/pause?mode=abort&engine=keep", "")
	if p.Get("engines.0.status").Int() != 200 {
		t.Fatalf("the engine's own pause: %s", p.Raw)
	}
	testenv.WaitFor(t, time.Minute, func() string {
		return "not drained: " + resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain").Raw + "\n" + logs.String()
	}, func() bool {
		return resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain.drained").Bool()
	})
	parked := resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain.parked_streams").Int()
	t.Logf("pause(abort, engine keep) to drained: %v", time.Since(pausedAt).Round(time.Millisecond))
	resumeAdmin(t, addr, "PUT", "/api/v1/backends", strings.ReplaceAll(resumeTable(v.URL, "v1"), "mock-model", testenv.VLLMModel))
	if r := resumeAdmin(t, addr, "POST", "/api/v1/resume", ""); r.Get("engines.0.status").Int() != 200 {
		t.Fatalf("the engine's own resume: %s", r.Raw)
	}
	wg.Wait()
	t.Logf("%d of %d streams parked by the pause", parked, agents)
	if parked == 0 {
		t.Fatalf("no stream was mid-generation at the pause\n%s", logs)
	}
	store := resumeStore(t, db)
	resumed := 0
	for i, a := range as {
		rollout := fmt.Sprintf("real-%d", i)
		if a.err != nil {
			t.Fatalf("%s: %v\n%s", rollout, a.err, logs)
		}
		msg, finish := tiReadStream(t, a.body)
		row := tiRows(t, store, rollout, "a", 1, logs)[0]
		ids := row.ResponseTokenIDs
		if finish != "length" || resumeUsage(a.body) != maxTokens || len(ids) != maxTokens || len(row.ResponseLogprobs) != maxTokens {
			t.Errorf("%s: finish %q, usage %d, %d ids, %d logprobs; want length and %d", rollout, finish, resumeUsage(a.body), len(ids), len(row.ResponseLogprobs), maxTokens)
		}
		if row.PolicyVersions != "" {
			resumed++
			var segs [][2]json.RawMessage
			if json.Unmarshal([]byte(row.PolicyVersions), &segs) != nil || len(segs) != 2 || string(segs[0][1]) != `"v0"` || string(segs[1][1]) != `"v1"` {
				t.Errorf("%s: policy_versions %s", rollout, row.PolicyVersions)
			}
		}
		tokens, _ := json.Marshal(ids)
		det := resumePost(t, strings.TrimSuffix(v.URL, "/v1")+"/detokenize", `{"model":"`+testenv.VLLMModel+`","tokens":`+string(tokens)+`}`)
		if msg.Content != det.Get("prompt").Str {
			t.Errorf("%s (policy_versions %s): the client received\n%q\nvLLM detokenizes the row's ids to\n%q", rollout, row.PolicyVersions, msg.Content, det.Get("prompt").Str)
		}
	}
	if int64(resumed) != parked {
		t.Errorf("%d rows with two segments, %d streams parked", resumed, parked)
	}
}

// resumePost POSTs a JSON body and returns the answer, failing on a status
// other than 200.
func resumePost(t *testing.T, url, body string) gjson.Result {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: HTTP %d: %s", url, resp.StatusCode, b)
	}
	return gjson.ParseBytes(b)
}

// TestResumeWhole: non-streamed token-in calls too. Four agents wait for
// whole 100-token answers (a token every 15 ms); the pause in mode abort
// aborts their generations (the engine answers the ids so far with
// finish_reason "abort", which no client sees), the table moves to the
// other mock under v1, and the resume generates the rest there: each
// client gets one answer of 100 tokens (finish "length", usage 100
// completion tokens) whose content is the mock's decoding of its row's
// ids, and each row's policy_versions is [[0,"v0"],[k,"v1"]], 0 < k < 100.
func TestResumeWhole(t *testing.T) {
	const agents, maxTokens = 4, 100
	msA, urlA := resumeMock(t, 1, 15*time.Millisecond, 0)
	msB, urlB := resumeMock(t, 2, 15*time.Millisecond, 0)
	addr, db, logs := resumeGateway(t, urlA, "mock-model")
	bodies := make([][]byte, agents)
	errs := make([]error, agents)
	var wg sync.WaitGroup
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"mock-model","messages":[{"role":"user","content":"Tell me the story of whole-%d"}],"max_tokens":%d,"logprobs":true}`, i, maxTokens)
			resp, err := http.Post(fmt.Sprintf("http://%s/rollout/whole-%d/attempt/a/v1/chat/completions", addr, i), "application/json", strings.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			bodies[i], errs[i] = io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				errs[i] = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bodies[i])
			}
		}()
	}
	testenv.WaitFor(t, 30*time.Second, func() string { return fmt.Sprintf("%d of %d generating\n%s", msA.Generating(), agents, logs) },
		func() bool { return msA.Generating() == agents })
	resumeAdmin(t, addr, "POST", "/api/v1/pause?mode=abort", "")
	testenv.WaitFor(t, 30*time.Second, func() string {
		return "not drained: " + resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain").Raw + "\n" + logs.String()
	}, func() bool {
		d := resumeAdmin(t, addr, "GET", "/api/v1/backends", "").Get("drain")
		return d.Get("drained").Bool() && d.Get("parked_streams").Int() == agents
	})
	resumeAdmin(t, addr, "PUT", "/api/v1/backends", resumeTable(urlB, "v1"))
	resumeAdmin(t, addr, "POST", "/api/v1/resume", "")
	wg.Wait()
	if msB.Requests() == 0 {
		t.Fatal("nothing reached the new mock")
	}
	wantResumes(t, addr, map[string]float64{"aborted": agents, "resumed": agents, "finished": 0, "failed": 0})
	store := resumeStore(t, db)
	for i := range agents {
		rollout := fmt.Sprintf("whole-%d", i)
		if errs[i] != nil {
			t.Fatalf("%s: %v\n%s", rollout, errs[i], logs)
		}
		ans := gjson.ParseBytes(bodies[i])
		row := tiRows(t, store, rollout, "a", 1, logs)[0]
		ids := row.ResponseTokenIDs
		var segs [][2]json.RawMessage
		_ = json.Unmarshal([]byte(row.PolicyVersions), &segs)
		var k int
		if len(segs) == 2 {
			_ = json.Unmarshal(segs[1][0], &k)
		}
		if ans.Get("choices.0.finish_reason").Str != "length" || ans.Get("usage.completion_tokens").Int() != maxTokens || len(ids) != maxTokens || len(row.ResponseLogprobs) != maxTokens ||
			len(segs) != 2 || string(segs[0][1]) != `"v0"` || string(segs[1][1]) != `"v1"` || k <= 0 || k >= maxTokens {
			t.Errorf("%s: finish %q, usage %d, %d ids, %d logprobs, policy_versions %q", rollout, ans.Get("choices.0.finish_reason").Str, ans.Get("usage.completion_tokens").Int(), len(ids), len(row.ResponseLogprobs), row.PolicyVersions)
		}
		if got, want := ans.Get("choices.0.message.content").Str, mock.Decode(ids); got != want {
			t.Errorf("%s: content\n%q\nthe row's ids decode to\n%q", rollout, got, want)
		}
	}
}
