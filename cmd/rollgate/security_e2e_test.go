package main

// Security drills against the real gateway process: hostile ids, calls
// refused for authentication, upstream secrets, defaults off loopback,
// memory per distinct input, a non-streamed client that hangs up, and the
// smaller leaks (admin reads, error echoes, debug logs).

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rawExchange sends raw bytes to addr and reads one HTTP response.
func rawExchange(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", truncateForLog(raw), err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	return r, string(b)
}

func truncateForLog(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// metricSum scrapes addr's /metrics and sums the samples of the metric
// whose line starts with prefix (a name, optionally with labels).
func metricSum(t *testing.T, addr, prefix string) float64 {
	t.Helper()
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		rest := line[len(prefix):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{' && !strings.HasSuffix(prefix, ",") && !strings.HasSuffix(prefix, "{")) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// stop sends SIGTERM and waits for a clean exit (capture flushed).
func stop(t *testing.T, cmd *exec.Cmd, logs *syncBuffer) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// serve gives its drain and flush 30 s; past 25 s the goroutines of a
	// process that is still draining are dumped (SIGQUIT) into its logs, so
	// a failure shows what it waited on.
	quit := time.AfterFunc(25*time.Second, func() { cmd.Process.Signal(syscall.SIGQUIT) })
	err := cmd.Wait()
	if !quit.Stop() {
		t.Fatalf("serve still draining 25 s after SIGTERM (goroutines dumped with SIGQUIT): exited with %v\n%s", err, logs)
	}
	if err != nil {
		t.Fatalf("serve exited with %v after SIGTERM\n%s", err, logs)
	}
}

// sqlCount runs a count query with rollgate sql and returns its value.
func sqlCount(t *testing.T, db, query string) int {
	t.Helper()
	return sqlCountOn(t, query, "--db", db)
}

// TestHostileIDsNeverReachHeadersOrRows: ids with CR/LF (URL-encoded in the
// path), over-long or with forbidden characters get a 400 OpenAI-style
// error; no header is injected, nothing is stored, no sequence id is used.
func TestHostileIDsNeverReachHeadersOrRows(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	body := `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`
	req := func(path string, headers ...string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + strings.Join(headers, "") +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
	}
	cases := []struct{ name, raw string }{
		{"CR/LF in the rollout id", req("/rollout/x%0d%0aSet-Cookie:%20a=b/attempt/1/v1/chat/completions")},
		{"LF in the attempt id", req("/rollout/good/attempt/1%0aSet-Cookie:%20c=d/v1/chat/completions")},
		{"NUL in the rollout id", req("/rollout/a%00b/attempt/1/v1/chat/completions")},
		{"over-long rollout id", req("/rollout/" + strings.Repeat("r", 129) + "/attempt/1/v1/chat/completions")},
		{"space in the header id", req("/v1/chat/completions", "x-rollout-id: a b\r\n")},
		{"C1 control character in x-task-id", req("/v1/chat/completions", "x-rollout-id: ok\r\nx-task-id: t\u0085x\r\n")},
		{"over-long x-agent-name", req("/v1/chat/completions", "x-agent-name: "+strings.Repeat("a", 257)+"\r\n")},
	}
	for _, tc := range cases {
		r, b := rawExchange(t, addr, tc.raw)
		if r.StatusCode != 400 || !strings.Contains(b, `"invalid_request_error"`) {
			t.Errorf("%s: %d %s, want a 400 OpenAI-style error", tc.name, r.StatusCode, b)
		}
		for _, h := range []string{"Set-Cookie", "X-Rollout-Id", "X-Attempt-Id", "X-Sequence-Id"} {
			if v := r.Header.Get(h); v != "" {
				t.Errorf("%s: response header %s: %q", tc.name, h, v)
			}
		}
	}
	if n := metricSum(t, addr, `rollgate_calls_rejected_total{reason="invalid_id"}`); n != float64(len(cases)) {
		t.Errorf("rollgate_calls_rejected_total{reason=invalid_id} = %v, want %d", n, len(cases))
	}
	// A well-formed call of the same rollout starts at sequence id 1.
	r, b := rawExchange(t, addr, req("/rollout/good/attempt/1/v1/chat/completions"))
	if r.StatusCode != 200 || r.Header.Get("X-Sequence-Id") != "1" || r.Header.Get("X-Rollout-Id") != "good" {
		t.Fatalf("valid call: %d %v %s", r.StatusCode, r.Header, b)
	}
	stop(t, cmd, logs)
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls"); n != 1 {
		t.Fatalf("%d rows stored, want only the valid call's", n)
	}
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE rollout_id <> 'good' OR instr(rollout_id || attempt_id || task_id, char(10)) > 0"); n != 0 {
		t.Fatalf("%d rows with a hostile id stored", n)
	}
}

// TestUnauthenticatedCallsLeaveNothing: with client keys, calls without a
// valid key (also with a body over the limit) are refused, counted, never
// stored under the rollout they name and take none of its sequence ids.
func TestUnauthenticatedCallsLeaveNothing(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", db, "--max-body-bytes", "2097152")
	cmd.Env = append(os.Environ(), "ROLLGATE_CLIENT_KEYS=owner=sk-owner-key")
	logs := startCmd(t, cmd, addr)
	big := `{"model":"mock-model","messages":[{"role":"user","content":"attacker ` + strings.Repeat("x", 1<<20) + `"}]}`
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for w := range 8 {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := range 25 {
				req, _ := http.NewRequest("POST", "http://"+addr+"/rollout/victim/attempt/1/v1/chat/completions", strings.NewReader(big))
				if (w+i)%2 == 0 {
					req.Header.Set("Authorization", "Bearer sk-guess-"+strconv.Itoa(i))
				}
				r, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				mu.Lock()
				statuses[r.StatusCode]++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if statuses[401] != 200 {
		t.Fatalf("statuses of 200 calls without a valid key: %v, want 200 × 401", statuses)
	}
	// Over the body limit and without a key: 401, not a captured 413.
	huge := `{"model":"mock-model","messages":[{"role":"user","content":"attacker ` + strings.Repeat("y", 3<<20) + `"}]}`
	r, err := http.Post("http://"+addr+"/rollout/victim/attempt/1/v1/chat/completions", "application/json", strings.NewReader(huge))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != 401 || r.Header.Get("X-Sequence-Id") != "" {
		t.Fatalf("oversized call without a key: %d %v", r.StatusCode, r.Header)
	}
	if n := metricSum(t, addr, `rollgate_calls_rejected_total{reason="unauthenticated"}`); n != 201 {
		t.Fatalf("rollgate_calls_rejected_total{reason=unauthenticated} = %v, want 201", n)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/rollout/victim/attempt/1/v1/chat/completions",
		strings.NewReader(`{"model":"mock-model","messages":[{"role":"user","content":"the owner"}]}`))
	req.Header.Set("Authorization", "Bearer sk-owner-key")
	r, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("X-Sequence-Id") != "1" {
		t.Fatalf("the owner's first call: %d, sequence id %q, want 1", r.StatusCode, r.Header.Get("X-Sequence-Id"))
	}
	stop(t, cmd, logs)
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls"); n != 1 {
		t.Fatalf("%d rows stored, want only the owner's call", n)
	}
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE request_body LIKE '%attacker%' OR api_key_name <> 'owner'"); n != 0 {
		t.Fatalf("%d rows of refused calls stored", n)
	}
}

// startCmd starts a prepared serve command and waits for its /readyz.
func startCmd(t *testing.T, cmd *exec.Cmd, addr string) *syncBuffer {
	t.Helper()
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitUntil(t, "the gateway on "+addr, 20*time.Second, func() bool {
		r, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})
	return logs
}

// spy is an HTTP server that records the Authorization headers it is sent.
type spy struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
	hits  int
}

func newSpy(t *testing.T) *spy {
	s := &spy{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.hits++
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"spy","object":"model","owned_by":"spy"}]}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *spy) seen() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits, append([]string(nil), s.auths...)
}

// TestUpstreamKeysStayWithTheirBackends: the runtime API cannot make the
// gateway read an arbitrary environment variable, nor send a configured key
// to a URL the operator did not pair it with; a listener put in the routing
// table is health-checked without ever seeing a secret.
func TestUpstreamKeysStayWithTheirBackends(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr)
	sp := newSpy(t)
	addr := freeAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "rollgate.yaml")
	os.WriteFile(cfgPath, []byte("health_interval: 50ms\n"), 0o600)
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"),
		"--config", cfgPath, "--upstream", "http://"+mockAddr+"/v1", "--upstream-kind", "vllm", "--model", "mock-model")
	secrets := map[string]string{
		"ROLLGATE_UPSTREAM_API_KEY": "sk-upstream-secret-1",
		"SOME_OTHER_SECRET":         "sk-unrelated-secret-2",
		"ROLLGATE_CLIENT_KEYS":      "agents=sk-client-secret-3",
	}
	cmd.Env = os.Environ()
	for k, v := range secrets {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logs := startCmd(t, cmd, addr)
	put := func(doc string) (int, string) {
		req, _ := http.NewRequest("PUT", "http://"+addr+"/api/v1/backends", strings.NewReader(doc))
		req.Header.Set("Content-Type", "application/json") // a body without one is refused with no admin token
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	spyURL := sp.URL + "/v1"
	for env, want := range map[string]string{
		"SOME_OTHER_SECRET":         "not configured at start",
		"HOME":                      "not configured at start",
		"ROLLGATE_CLIENT_KEYS":      "not configured at start",
		"ROLLGATE_UPSTREAM_API_KEY": "not paired with",
	} {
		status, body := put(`{"backends":[{"model":"spy","replicas":[{"url":"` + spyURL + `","kind":"openai","api_key_env":"` + env + `"}]}]}`)
		if status != 400 || !strings.Contains(body, want) {
			t.Errorf("PUT a replica at the spy with api_key_env %s: %d %s (want 400, %q)", env, status, body, want)
		}
	}
	// Allowed: the configured key on its own backend, and the spy without a key.
	status, body := put(`{"backends":[
		{"model":"mock-model","replicas":[{"url":"http://` + mockAddr + `/v1","kind":"vllm","api_key_env":"ROLLGATE_UPSTREAM_API_KEY"}]},
		{"model":"spy","replicas":[{"url":"` + spyURL + `","kind":"openai"}]}]}`)
	if status != 200 {
		t.Fatalf("PUT with the paired key: %d %s", status, body)
	}
	for _, v := range secrets {
		if strings.Contains(body, v) {
			t.Fatalf("GET/PUT backends shows a secret: %s", body)
		}
	}
	// Health checks reach the spy (the table is live); a call too.
	waitUntil(t, "health checks of the spy", 20*time.Second, func() bool { n, _ := sp.seen(); return n >= 3 })
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"spy","messages":[]}`))
	req.Header.Set("Authorization", "Bearer sk-client-secret-3")
	if r, err := http.DefaultClient.Do(req); err == nil {
		r.Body.Close()
	}
	_, auths := sp.seen()
	for _, a := range auths {
		for name, v := range secrets {
			if strings.Contains(a, v) {
				t.Fatalf("the spy received %s's value: %q\n%s", name, a, logs)
			}
		}
	}
}

// TestNonLoopbackNeedsAdminToken: off loopback, serve refuses to start
// without ROLLGATE_ADMIN_TOKEN unless --insecure-admin; with a token every
// /api/v1 route needs it while health and metrics stay open.
func TestNonLoopbackNeedsAdminToken(t *testing.T) {
	_, port, _ := net.SplitHostPort(freeAddr(t))
	wild := "0.0.0.0:" + port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "serve", "--listen", wild, "--db", filepath.Join(t.TempDir(), "r.db")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--insecure-admin") || !strings.Contains(string(out), "ROLLGATE_ADMIN_TOKEN") {
		t.Fatalf("serve on %s without a token: %v\n%s", wild, err, out)
	}
	out, err = exec.CommandContext(ctx, binary, "serve", "--debug-listen", "0.0.0.0:0", "--listen", freeAddr(t), "--db", filepath.Join(t.TempDir(), "r.db")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--debug-listen") {
		t.Fatalf("serve with pprof on all interfaces without a token: %v\n%s", err, out)
	}

	cmd := exec.Command(binary, "serve", "--listen", wild, "--insecure-admin", "--db", filepath.Join(t.TempDir(), "r.db"))
	logs := startCmd(t, cmd, "127.0.0.1:"+port)
	stop(t, cmd, logs)

	cmd = exec.Command(binary, "serve", "--listen", wild, "--db", filepath.Join(t.TempDir(), "r.db"))
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN=adm-token-1")
	startCmd(t, cmd, "127.0.0.1:"+port)
	base := "http://127.0.0.1:" + port
	get := func(path, auth string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return r.StatusCode
	}
	for _, p := range []string{"/api/v1/backends", "/api/v1/rollouts?after=0", "/api/v1/resources/latest", "/api/v1/bridge/counts"} {
		if s := get(p, ""); s != 401 {
			t.Errorf("GET %s without the token: %d, want 401", p, s)
		}
		if s := get(p, "Bearer wrong"); s != 401 {
			t.Errorf("GET %s with a wrong token: %d, want 401", p, s)
		}
	}
	if s := get("/api/v1/backends", "BEARER adm-token-1"); s != 200 {
		t.Errorf("GET backends with the token (scheme in capitals): %d", s)
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if s := get(p, ""); s != 200 {
			t.Errorf("GET %s must stay open: %d", p, s)
		}
	}
	if s, _, _ := post(t, base+"/healthz", "{}"); s != 405 {
		t.Errorf("POST /healthz: %d, want 405", s)
	}
}

// TestMemoryBoundedPerInput: distinct model names (4 MiB each) and 20,000
// distinct rollout ids grow the gateway's heap by less than the documented
// bound of what it keeps per input (README, Security).
func TestMemoryBoundedPerInput(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr)
	addr, dbg := freeAddr(t), freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cfgPath := filepath.Join(t.TempDir(), "rollgate.yaml")
	os.WriteFile(cfgPath, []byte("max_tracked_attempt_bytes: 4194304\n"), 0o600)
	cmd := exec.Command(binary, "serve", "--listen", addr, "--debug-listen", dbg, "--db", db, "--config", cfgPath,
		"--upstream", "http://"+mockAddr+"/v1", "--upstream-kind", "vllm", "--model", "mock-model")
	logs := startCmd(t, cmd, addr)
	heap := func() float64 {
		// A heap profile with gc=1 runs a collection first.
		r, err := http.Get("http://" + dbg + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return metricSum(t, addr, "go_memstats_heap_inuse_bytes")
	}
	settle := func() {
		waitUntil(t, "the capture queue to drain", 60*time.Second, func() bool {
			return metricSum(t, addr, "rollgate_capture_queue_depth") == 0
		})
	}
	settle()
	before := heap()

	// 30 distinct 4 MiB model names (unrouted: 404).
	for i := range 30 {
		name := strings.Repeat(strconv.Itoa(i%10), 4<<20)
		s, _, _ := post(t, "http://"+addr+"/v1/chat/completions", `{"model":"`+name+`","messages":[]}`)
		if s != 404 {
			t.Fatalf("unrouted model: %d", s)
		}
	}
	// 20,000 distinct rollout ids of the longest valid length.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := &http.Client{}
			for i := w; i < 20000; i += 16 {
				id := fmt.Sprintf("%0128d", i)
				r, err := client.Post("http://"+addr+"/rollout/"+id+"/attempt/1/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				if r.StatusCode != 200 {
					errs <- fmt.Errorf("rollout %d: status %d", i, r.StatusCode)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	settle()
	after := heap()
	const bound = 48 << 20 // sequence table 4 MiB here (at most 1.5 × + 1 MiB of heap) + turn tracker + names + slack
	if grew := after - before; grew > bound {
		t.Fatalf("heap in use grew by %.1f MiB (%.1f → %.1f), bound %d MiB\n%s", grew/(1<<20), before/(1<<20), after/(1<<20), bound>>20, logs)
	}
	t.Logf("heap in use: %.1f MiB → %.1f MiB", before/(1<<20), after/(1<<20))
}

// TestNonStreamedHangupCancelsBackend: a client that hangs up while its
// non-streamed call is generating cancels the backend call; the row says so.
func TestNonStreamedHangupCancelsBackend(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr)
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db,
		"--upstream", "http://"+mockAddr+"/v1", "--upstream-kind", "vllm", "--model", "mock-model")
	body := `{"model":"mock-model","messages":[{"role":"user","content":"take your time"}]}`
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	// 120 tokens a second apart: two minutes of generation.
	fmt.Fprintf(c, "POST /rollout/gone/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"x-mock-itl-ms: 1000\r\nx-mock-tokens: 120\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitUntil(t, "the call to reach the backend", 20*time.Second, func() bool {
		return metricSum(t, addr, "rollgate_backend_in_flight_requests") == 1
	})
	c.Close()
	// Cancelled: the backend call ends long before its two minutes.
	waitUntil(t, "the backend call to be cancelled", 30*time.Second, func() bool {
		return metricSum(t, addr, "rollgate_backend_in_flight_requests") == 0
	})
	stop(t, cmd, logs)
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE rollout_id = 'gone' AND http_status = 499 AND error = 'client disconnected before the response'"); n != 1 {
		t.Fatalf("row of the abandoned call:\n%s", runCmd(t, "sql", "--db", db, "SELECT http_status, error FROM llm_calls"))
	}
}

// TestErrorsAndLogsKeepCredentials: fasthttp's errors for unreadable
// requests quote the raw request; neither the answer nor a debug log line
// may carry the Authorization header.
func TestErrorsAndLogsKeepCredentials(t *testing.T) {
	addr := freeAddr(t)
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"), "--log-level", "debug")
	cmd.Env = append(os.Environ(), "ROLLGATE_CLIENT_KEYS=team=sk-team-secret-9")
	logs := startCmd(t, cmd, addr)
	auth := "Authorization: Bearer sk-team-secret-9\r\n"
	raws := map[string]string{
		"over-long header block": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "X-Pad: " + strings.Repeat("a", 9000) + "\r\n\r\n",
		"bad Content-Length":     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: abc\r\n\r\n",
		"bad chunked body":       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
	}
	for name, raw := range raws {
		r, b := rawExchange(t, addr, raw)
		if r.StatusCode < 400 || r.StatusCode >= 500 || strings.Contains(b, "sk-team-secret-9") || !strings.Contains(b, `"error"`) {
			t.Errorf("%s: %d %s", name, r.StatusCode, b)
		}
	}
	// A normal call with the key, then make sure everything was logged.
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"mock-model","messages":[]}`))
	req.Header.Set("Authorization", "Bearer sk-team-secret-9")
	if r, err := http.DefaultClient.Do(req); err == nil {
		r.Body.Close()
	}
	stop(t, cmd, logs)
	if strings.Contains(logs.String(), "sk-team-secret-9") {
		t.Fatalf("the client key is in the logs:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "level=DEBUG") {
		t.Fatalf("no debug lines were logged, the check proves nothing:\n%s", logs)
	}
}
