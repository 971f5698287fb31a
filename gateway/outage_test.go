package gateway_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// spooledStore wraps a store: writes go through a durable spool, reads to the store.
type spooledStore struct {
	export.Store
	sp *spool.Spool
}

func (s spooledStore) Write(ctx context.Context, b *export.Batch) error { return s.sp.Write(ctx, b) }

// TestClickHouseOutageNothingLost runs agents through the real gateway while
// the real ClickHouse is killed and restarted: every call the clients got an
// answer for is stored exactly once, with the engine's exact token ids.
func TestClickHouseOutageNothingLost(t *testing.T) {
	srv, err := testenv.StartRestartableClickHouse()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	dsn := testenv.FreshDatabase(srv.DSN(), "outage")
	store, err := clickhouse.Open(context.Background(), dsn, clickhouse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	sp, err := spool.New(spool.Config{Dir: filepath.Join(t.TempDir(), "spool"), DirectTimeout: time.Second, RetryMax: 200 * time.Millisecond},
		store, "clickhouse", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, spooledStore{Store: store, sp: sp}, nil)

	var mu sync.Mutex
	spans := map[string]bool{}
	call := func(agent, turn int) {
		r := do(t, "POST", e.url+"/rollout/out-"+string(rune('a'+agent))+"/attempt/1/v1/chat/completions", withStream(chatBody, `"stream":true`))
		if r.status != 200 {
			t.Errorf("agent %d turn %d: %d", agent, turn, r.status)
			return
		}
		mu.Lock()
		spans[r.header.Get("x-request-id")] = true
		mu.Unlock()
	}
	load := func(turns int) {
		var wg sync.WaitGroup
		for a := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range turns {
					call(a, i)
				}
			}()
		}
		wg.Wait()
	}
	load(5)
	srv.Kill()
	load(10) // ClickHouse is down: rows go to the spool
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	load(5)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.pipe.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sp.Drain(ctx); err != nil {
		t.Fatalf("spool did not drain: %v (%+v)", err, sp.Stats())
	}
	if len(spans) != 80 {
		t.Fatalf("%d answered calls, want 80", len(spans))
	}
	rows, err := store.Calls(ctx, export.CallFilter{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rows {
		seen[r.SpanID]++
		if r.TokenSource != export.TokenSourceEngine || len(r.ResponseTokenIDs) != int(r.CompletionTokens) || len(r.ResponseTokenIDs) == 0 {
			t.Fatalf("row %s: source %q, %d ids for %d tokens", r.SpanID, r.TokenSource, len(r.ResponseTokenIDs), r.CompletionTokens)
		}
	}
	missing, dup := 0, 0
	for s := range spans {
		switch seen[s] {
		case 0:
			missing++
		case 1:
		default:
			dup++
		}
	}
	if missing != 0 || dup != 0 || len(rows) != len(spans) {
		t.Fatalf("after the outage: %d rows for %d calls, %d missing, %d duplicated", len(rows), len(spans), missing, dup)
	}
	t.Logf("80 calls, %d spilled to the spool during the outage, all stored once", sp.Stats().SpilledRows)
}
