package ui

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// BenchmarkListClickHouse times the rollout list over loopback HTTP against
// ClickHouse holding ROLLGATE_BENCH_UI_CALLS captured calls (default
// 10,000; the closing note's figure is 10^6), 8 calls per rollout, 16
// rollouts per group, each rollout registered: the first page, a page
// filtered by task, the page after the first, and a group filter.
//
//	ROLLGATE_BENCH_UI_CALLS=1000000 go test -run '^$' -bench BenchmarkListClickHouse -benchtime 20x -timeout 30m ./ui/
func BenchmarkListClickHouse(b *testing.B) {
	n := benchCalls(b)
	ctx := context.Background()
	dsn := testenv.FreshDatabase(serverDSN, fmt.Sprintf("b_ui_list_%d", n))
	s, err := clickhouse.Open(ctx, dsn, clickhouse.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	res, err := s.Query(ctx, "SELECT count() FROM llm_calls")
	if err != nil {
		b.Fatal(err)
	}
	if have, _ := strconv.Atoi(res.Rows[0][0]); have != n {
		if err := testenv.DropDatabase(ctx, dsn); err != nil {
			b.Fatal(err)
		}
		s.Close()
		if s, err = clickhouse.Open(ctx, dsn, clickhouse.Options{}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		fillBench(b, s, n)
		b.Logf("stored %d calls in %s", n, time.Since(start).Round(time.Second))
	}
	base := serve(b, s, Config{})
	last := (n/8 - 1)
	pages := map[string]string{
		"first":  "/ui",
		"task":   "/ui/rollouts?task=task-7",
		"group":  "/ui/rollouts?group=g-" + strconv.Itoa(last/16),
		"page-2": "",
	}
	_, body := getB(b, base+"/ui")
	if m := nextRe.FindStringSubmatch(body); m != nil {
		pages["page-2"] = htmlUnescape(m[1])
	}
	for _, name := range []string{"first", "task", "group", "page-2"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if code, body := getB(b, base+pages[name]); code != 200 {
					b.Fatalf("%d %.300s", code, body)
				}
			}
		})
	}
}

// BenchmarkListRefresh times the list's live refresh (?part=rows, what
// every open list tab asks for every 2 s) on the embedded store holding
// ROLLGATE_BENCH_UI_CALLS calls (default 10,000): "full" reads the page as
// the script did before it sent its version (the list's aggregates),
// "unchanged" is the refresh of a tab whose version is current (204 after
// one query of indexes).
//
//	ROLLGATE_BENCH_UI_CALLS=557000 go test -run '^$' -bench BenchmarkListRefresh -benchtime 20x ./ui/
func BenchmarkListRefresh(b *testing.B) {
	n := benchCalls(b)
	s, err := sqlite.Open(filepath.Join(b.TempDir(), "ui.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	fillBench(b, s, n)
	base := serve(b, s, Config{})
	resp, err := http.Get(base + "/ui/rollouts?part=rows")
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	version := resp.Header.Get("X-Rollgate-Version")
	if version == "" {
		b.Fatal("no X-Rollgate-Version header")
	}
	for _, tc := range []struct {
		name, path string
		want       int
	}{{"full", "/ui/rollouts?part=rows", 200}, {"unchanged", "/ui/rollouts?part=rows&v=" + url.QueryEscape(version), 204}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if code, body := getB(b, base+tc.path); code != tc.want {
					b.Fatalf("%d, want %d: %.300s", code, tc.want, body)
				}
			}
		})
	}
}

// benchCalls is ROLLGATE_BENCH_UI_CALLS (default 10,000).
func benchCalls(b *testing.B) int {
	v := os.Getenv("ROLLGATE_BENCH_UI_CALLS")
	if v == "" {
		return 10_000
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// fillBench stores n calls: 8 per rollout, rollouts registered in groups
// of 16, 100 tasks, small bodies.
func fillBench(b *testing.B, s export.Store, n int) {
	const t0 = uint64(1_800_000_000_000_000_000)
	batch := &export.Batch{}
	flush := func() {
		if err := s.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
		batch = &export.Batch{}
	}
	for i := 0; i < n; i++ {
		r, seq := i/8, uint64(i%8+1)
		ro := fmt.Sprintf("ro-%07d", r)
		at := t0 + uint64(i)*1_000_000
		batch.Calls = append(batch.Calls, export.Call{SpanID: fmt.Sprintf("s%d", i), RolloutID: ro, AttemptID: "a1", TaskID: fmt.Sprintf("task-%d", r%100),
			AgentName: "coder", SequenceID: seq, StartTimeUnixNano: at, EndTimeUnixNano: at + 5e8, HTTPStatus: 200, Endpoint: "/v1/chat/completions",
			Model: "m", Backend: "r0", PolicyVersion: "1", RequestBody: `{"messages":[{"role":"user","content":"q"}]}`, ResponseMessage: `{"role":"assistant","content":"a"}`,
			PromptTokenIDs: []uint32{1, 2, 3, 4}, ResponseTokenIDs: []uint32{5, 6}, ResponseLogprobs: []float32{-0.1, -0.2},
			TokenSource: export.TokenSourceEngine, FinishReason: "stop", PromptTokens: 4, CompletionTokens: 2, TurnKind: "prefix"})
		if seq == 8 {
			batch.Rollouts = append(batch.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a1", TaskID: fmt.Sprintf("task-%d", r%100),
				GroupID: "g-" + strconv.Itoa(r/16), Status: "succeeded", Metadata: "{}", CreatedUnixNano: at, UpdatedUnixNano: at + 1})
			batch.Rewards = append(batch.Rewards, export.Reward{RolloutID: ro, AttemptID: "a1", Name: "primary", Value: float64(r % 2), Source: "api", TimeUnixNano: at + 2})
		}
		if len(batch.Calls) == 50_000 {
			flush()
		}
	}
	flush()
}

func getB(b *testing.B, u string) (int, string) {
	resp, err := http.Get(u)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
