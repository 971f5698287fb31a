package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// drillITL and drillAgents shape the restart drill's load: the mock's
// inter-token latency (ms) and the agents of the SIGKILL phases; set
// ROLLGATE_RESTART_DRILL_ITL_MS and ROLLGATE_RESTART_DRILL_AGENTS for a
// heavier drill (e.g. 0 and 64).
var (
	drillITL    = envOr("ROLLGATE_RESTART_DRILL_ITL_MS", "5")
	drillAgents = envOr("ROLLGATE_RESTART_DRILL_AGENTS", "16")
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// answered is a call whose complete response the client received.
type answered struct {
	span string
	at   time.Time
}

// loadGen keeps workers calling the gateway (streamed and not) until stopped.
type loadGen struct {
	mu        sync.Mutex
	ok        []answered
	truncated []string // responses that started but did not complete
	inFlight  atomic.Int64
	stop      chan struct{}
	wg        sync.WaitGroup
}

func startLoad(addr string, workers int) *loadGen {
	g := &loadGen{stop: make(chan struct{})}
	client := &http.Client{Timeout: 30 * time.Second}
	for w := 0; w < workers; w++ {
		g.wg.Add(1)
		go func(w int) {
			defer g.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-g.stop:
					return
				default:
				}
				stream := (w+i)%2 == 0
				body := fmt.Sprintf(`{"model":"mock-model","messages":[{"role":"user","content":"call %d of worker %d"}],"stream":%v}`, i, w, stream)
				req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("x-mock-itl-ms", drillITL)
				req.Header.Set("x-mock-tokens", "20")
				g.inFlight.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					g.inFlight.Add(-1)
					time.Sleep(20 * time.Millisecond) // the agent's retry pace while the gateway is down or restarting, not a wait
					continue
				}
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				g.inFlight.Add(-1)
				span := resp.Header.Get("x-request-id")
				complete := rerr == nil && resp.StatusCode == 200 &&
					((stream && strings.Contains(string(b), "data: [DONE]")) || (!stream && strings.Contains(string(b), `"choices"`)))
				g.mu.Lock()
				if complete {
					g.ok = append(g.ok, answered{span, time.Now()})
				} else if resp.StatusCode == 200 {
					g.truncated = append(g.truncated, span)
				}
				g.mu.Unlock()
			}
		}(w)
	}
	return g
}

// underWay waits until the workers have had n calls answered and have calls
// in flight: the moment to signal, kill or take down what they call.
func (g *loadGen) underWay(t *testing.T, n int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d answered calls and more in flight", n), 60*time.Second, func() bool {
		g.mu.Lock()
		ok := len(g.ok)
		g.mu.Unlock()
		return ok >= n && g.inFlight.Load() > 0
	})
}

func (g *loadGen) halt() ([]answered, []string) {
	close(g.stop)
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ok, g.truncated
}

// TestGatewayRestartLosesNothingAcknowledged runs the real binary with a
// durable spool in front of a real ClickHouse it takes down and brings back:
//  1. SIGTERM under load: in-flight calls finish, every answered call is stored;
//  2. ClickHouse down, load, a pause, SIGKILL: everything answered was in the
//     spool; the next gateway replays it once ClickHouse is back;
//  3. ClickHouse down, SIGKILL in the middle of the load (16 agents, streamed
//     and not): calls answered in the last moments were still in the capture
//     pipeline's memory; the write-ahead log in the spool folder has them;
//  4. ClickHouse up, SIGKILL in the middle of the load: some of the calls
//     the write-ahead log replays were stored already; they are not stored twice.
//
// Every answered call must be stored exactly once. With
// ROLLGATE_RESTART_DRILL_NO_WAL=1 the gateway runs with --capture-wal=false
// and the test only reports what phases 3 and 4 lose (the "before" figure).
func TestGatewayRestartLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: restarts ClickHouse and the gateway under load")
	}
	srv, err := testenv.StartRestartableClickHouse()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dsn := testenv.FreshDatabase(srv.DSN(), "restart")
	spoolDir := t.TempDir()
	addr := freeAddr(t)
	noWAL := os.Getenv("ROLLGATE_RESTART_DRILL_NO_WAL") == "1"
	args := []string{"serve", "--listen", addr, "--clickhouse", dsn, "--spool-dir", spoolDir, "--log-level", "warn",
		"--db", filepath.Join(t.TempDir(), "q.db"), "--capture-wal=" + strconv.FormatBool(!noWAL)}
	waitExit := func(cmd *exec.Cmd) error {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			t.Fatal("gateway did not exit within 60 s")
			return nil
		}
	}

	// 1. SIGTERM under load.
	g1, logs1 := start(t, addr, "/readyz", args...)
	load := startLoad(addr, 12)
	load.underWay(t, 180) // what 1.5 s of this load answers on an idle machine
	if err := g1.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(g1); err != nil {
		t.Fatalf("gateway after SIGTERM: %v\n%s", err, logs1)
	}
	phase1, truncated := load.halt()
	if len(truncated) > 0 {
		t.Fatalf("SIGTERM cut %d responses short instead of draining them: %v", len(truncated), truncated)
	}

	// 2. ClickHouse down; SIGKILL after a pause.
	g2, _ := start(t, addr, "/readyz", args...)
	srv.Stop()
	load = startLoad(addr, 12)
	load.underWay(t, 180)
	phase2, _ := load.halt()
	waitUntil(t, "the answered calls to be spooled", 20*time.Second, func() bool {
		_, b := readyzBody(t, addr)
		return b.Get("spool_records").Int() > 0 && (noWAL || b.Get("wal_pending").Int() == 0)
	})
	if noWAL { // no WAL to ask: wait until every captured row (llm_calls is the only table exported) is written to the spool
		waitUntil(t, "the captured rows to be written to the spool", 20*time.Second, func() bool {
			captured := metricSum(t, addr, "rollgate_captured_rows_total")
			return captured >= float64(len(phase2)) && metricSum(t, addr, "rollgate_capture_queue_depth") == 0 &&
				metricSum(t, addr, "rollgate_export_rows_total") >= captured
		})
	}
	_ = g2.Process.Kill()
	_ = waitExit(g2)

	// killMidLoad starts a gateway, 16 agents, and SIGKILLs the gateway
	// while they call it; it returns the calls answered and when the kill was.
	killMidLoad := func() ([]answered, time.Time) {
		g, _ := start(t, addr, "/readyz", args...)
		agents, _ := strconv.Atoi(drillAgents)
		load := startLoad(addr, agents)
		load.underWay(t, 30*agents) // what 3 s of this load answers on an idle machine
		_ = g.Process.Kill()
		killed := time.Now()
		_ = waitExit(g)
		phase, _ := load.halt()
		return phase, killed
	}
	// 3. ClickHouse down; SIGKILL in the middle of the load.
	phase3, killed3 := killMidLoad()
	// 4. ClickHouse up; SIGKILL in the middle of the load.
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	phase4, killed4 := killMidLoad()

	// A fresh gateway on the same spool replays the spool and the WAL.
	start(t, addr, "/readyz", args...)
	waitUntil(t, "the spool and the write-ahead log to drain into ClickHouse", 90*time.Second, func() bool {
		_, b := readyzBody(t, addr)
		return b.Get("store").String() == "up" && b.Get("spool_records").Int() == 0 && b.Get("wal_pending").Int() == 0
	})
	store, err := clickhouse.Open(context.Background(), dsn, clickhouse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	got := spanCounts(t, store)
	lost := func(phase []answered, killedAt time.Time) (n, dup int, oldest time.Duration) {
		for _, a := range phase {
			switch got[a.span] {
			case 0:
				n++
				oldest = max(oldest, killedAt.Sub(a.at))
			case 1:
			default:
				dup++
				t.Errorf("call %s stored %d times", a.span, got[a.span])
			}
		}
		return n, dup, oldest
	}
	lost12, dup12, _ := lost(append(append([]answered{}, phase1...), phase2...), time.Now())
	lost3, dup3, old3 := lost(phase3, killed3)
	lost4, dup4, old4 := lost(phase4, killed4)
	t.Logf("WAL %v. SIGTERM phase: %d answered; quiet SIGKILL phase (ClickHouse down): %d answered; lost %d, duplicated %d", !noWAL, len(phase1), len(phase2), lost12, dup12)
	t.Logf("SIGKILL mid-load, ClickHouse down, %s agents: %d answered, %d lost (answered at most %v before the kill), %d duplicated",
		drillAgents, len(phase3), lost3, old3.Round(time.Millisecond), dup3)
	t.Logf("SIGKILL mid-load, ClickHouse up, %s agents: %d answered, %d lost (answered at most %v before the kill), %d duplicated",
		drillAgents, len(phase4), lost4, old4.Round(time.Millisecond), dup4)
	if len(phase1) == 0 || len(phase2) == 0 || len(phase3) == 0 || len(phase4) == 0 {
		t.Fatalf("a phase made no calls: %d %d %d %d", len(phase1), len(phase2), len(phase3), len(phase4))
	}
	if lost12 > 0 {
		t.Errorf("%d answered calls of the SIGTERM and quiet SIGKILL phases never reached ClickHouse", lost12)
	}
	if !noWAL && lost3+lost4 > 0 {
		t.Errorf("SIGKILL mid-load lost %d + %d answered calls", lost3, lost4)
	}
}
