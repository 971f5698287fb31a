package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// readyzBody returns GET /readyz's status code and parsed body.
func readyzBody(t *testing.T, addr string) (int, gjson.Result) {
	t.Helper()
	r, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, gjson.ParseBytes(b)
}

// spanCounts returns how many llm_calls rows each span id has.
func spanCounts(t *testing.T, store *clickhouse.Store) map[string]int {
	t.Helper()
	res, err := store.Query(context.Background(), "SELECT span_id, count() FROM llm_calls GROUP BY span_id")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range res.Rows {
		var n int
		fmt.Sscan(r[1], &n)
		m[r[0]] = n
	}
	return m
}

// TestServeStartsWithStoreDown: ClickHouse is stopped; without --spool-dir
// serve fails fast and says to add it; with --spool-dir it starts, answers
// agents (streamed and not), reports the store down in /readyz, answers the
// store reads with 503, and once ClickHouse is started it connects and the
// spool is replayed: every answered call is stored exactly once.
func TestServeStartsWithStoreDown(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts and stops a ClickHouse server")
	}
	srv, err := testenv.StartRestartableClickHouse()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dsn := testenv.FreshDatabase(srv.DSN(), "storedown")
	srv.Stop()
	tmp := t.TempDir()

	// Without a spool: a clear, fast failure.
	out, err := exec.Command(binary, "serve", "--listen", freeAddr(t), "--clickhouse", dsn, "--db", filepath.Join(tmp, "q0.db")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--spool-dir") {
		t.Fatalf("serve with ClickHouse down and no spool: err %v, want a failure naming --spool-dir:\n%s", err, out)
	}

	addr := freeAddr(t)
	g, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--clickhouse", dsn, "--spool-dir", filepath.Join(tmp, "spool"),
		"--db", filepath.Join(tmp, "q.db"), "--log-level", "info")
	waitUntil(t, "/readyz to report the store down", 20*time.Second, func() bool {
		code, b := readyzBody(t, addr)
		return code == 200 && b.Get("store").String() == "down"
	})

	client := &http.Client{Timeout: 30 * time.Second}
	var spans []string
	for i := 0; i < 40; i++ {
		stream := i%2 == 0
		body := fmt.Sprintf(`{"model":"mock-model","messages":[{"role":"user","content":"call %d"}],"stream":%v}`, i, stream)
		req, _ := http.NewRequest("POST", "http://"+addr+"/rollout/down/attempt/1/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || (stream && !strings.Contains(string(b), "[DONE]")) || (!stream && !strings.Contains(string(b), `"choices"`)) {
			t.Fatalf("call %d with the store down: %d %s", i, resp.StatusCode, b)
		}
		spans = append(spans, resp.Header.Get("x-request-id"))
	}
	waitUntil(t, "the calls to be spooled", 20*time.Second, func() bool {
		_, b := readyzBody(t, addr)
		return b.Get("spool_records").Int() > 0
	})
	if code, b, _ := post(t, "http://"+addr+"/api/v1/rollouts/down/rewards", `{"value":1}`); code != 503 || !strings.Contains(b, "not connected yet") {
		t.Errorf("reward with the store down: %d %s, want 503 saying the store is not connected yet", code, b)
	}
	r, err := http.Get("http://" + addr + "/api/v1/rollouts/down")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 503 || !strings.Contains(string(b), "not connected yet") {
		t.Errorf("GET rollout with the store down: %d %s, want 503 saying the store is not connected yet", r.StatusCode, b)
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the store to connect and the spool to drain", 60*time.Second, func() bool {
		_, b := readyzBody(t, addr)
		return b.Get("store").String() == "up" && b.Get("spool_records").Int() == 0
	})
	store, err := clickhouse.Open(context.Background(), dsn, clickhouse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	got := spanCounts(t, store)
	for _, s := range spans {
		if got[s] != 1 {
			t.Errorf("call %s stored %d times, want once", s, got[s])
		}
	}
	if len(got) != len(spans) {
		t.Errorf("%d span ids stored, %d calls made", len(got), len(spans))
	}
	if code, body, _ := post(t, "http://"+addr+"/api/v1/rollouts/down/rewards", `{"value":1}`); code != 200 {
		t.Errorf("reward once the store is up: %d %s", code, body)
	}
	stop(t, g, logs)
	if !strings.Contains(logs.String(), "cannot connect to ClickHouse yet") || !strings.Contains(logs.String(), "store connected") {
		t.Errorf("the background connection is not logged:\n%s", logs)
	}
}
