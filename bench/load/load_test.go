package load_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/load"
	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// clickhouseDSN is the real ClickHouse server started for this test binary.
var clickhouseDSN string

func TestMain(m *testing.M) { testenv.Main(m, &clickhouseDSN) }

func openSQLite(t *testing.T) export.Store {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "rollgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openClickHouse(t *testing.T) export.Store {
	db := fmt.Sprintf("load_test_%d", time.Now().UnixNano()%1e12)
	s, err := clickhouse.Open(context.Background(), testenv.FreshDatabase(clickhouseDSN, db), clickhouse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// stack is a mock engine, a gateway in front of it and the gateway's store.
type stack struct {
	mockURL string // http://127.0.0.1:P (no /v1)
	gwURL   string // http://127.0.0.1:P
	store   export.Store
}

func newStack(t *testing.T, store export.Store) *stack {
	t.Helper()
	ms, base, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	pipe := capture.NewPipeline(capture.Config{FlushInterval: 10 * time.Millisecond, BatchSize: 64},
		[]capture.NamedSink{{Name: store.Name(), Sink: store}}, m, nil)
	gw, err := gateway.New(gateway.Config{
		Listen:          ln.Addr().String(),
		UpstreamTimeout: 20 * time.Second,
		Backends: []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{
			{Name: "mock-1", URL: base, Kind: "vllm"},
		}}},
		SequenceStore: gatewaytest.SequenceStore(t),
	}, pipe, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
		pipe.Close(ctx)
	})
	return &stack{mockURL: base[:len(base)-len("/v1")], gwURL: "http://" + ln.Addr().String(), store: store}
}

// TestRunThroughGateway runs small closed- and open-loop loads, streaming and
// not, through a real gateway and checks every call was captured once, in
// the embedded store and in ClickHouse.
func TestRunThroughGateway(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testRunThroughGateway(t, newStack(t, openSQLite(t))) })
	t.Run("clickhouse", func(t *testing.T) { testRunThroughGateway(t, newStack(t, openClickHouse(t))) })
}

func testRunThroughGateway(t *testing.T, s *stack) {
	cases := []struct {
		name string
		cfg  load.Config
	}{
		{"closed non-streaming", load.Config{Agents: 4, Turns: 3, Rollouts: 4, ToolEvery: 2}},
		{"closed streaming", load.Config{Agents: 4, Turns: 3, Rollouts: 4, ToolEvery: 2, Stream: true}},
		{"closed streaming with usage", load.Config{Agents: 2, Turns: 2, Rollouts: 2, Stream: true, IncludeUsage: true}},
		{"open streaming", load.Config{Mode: load.ModeOpen, Rate: 500, Requests: 12, Stream: true, ToolEvery: 3}},
		{"open streaming, 4 calls per rollout", load.Config{Mode: load.ModeOpen, Rate: 500, Requests: 12, Stream: true, ToolEvery: 3, OpenTurns: 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.BaseURL = s.gwURL
			res, err := load.Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			rep := res.Summary()
			wantCalls := cfg.Agents * cfg.Turns
			if cfg.Mode == load.ModeOpen {
				wantCalls = cfg.Requests
			}
			if rep.Requests != wantCalls || rep.OK != wantCalls || rep.Errors != 0 {
				t.Fatalf("calls: %d requests, %d ok, %d errors (%v); want %d ok", rep.Requests, rep.OK, rep.Errors, rep.ErrorKinds, wantCalls)
			}
			// Closed: turns 0 and 2 of each rollout offer the tool (1 sends its result);
			// open: every third call.
			wantTools := cfg.Rollouts * 2
			if cfg.Mode == load.ModeOpen {
				wantTools = cfg.Requests / 3
			}
			if cfg.ToolEvery > 0 && rep.ToolCalls != wantTools {
				t.Errorf("tool calls: %d, want %d", rep.ToolCalls, wantTools)
			}
			if rep.Latency.N != wantCalls || rep.Latency.P50 <= 0 || rep.Latency.P50 > rep.Latency.P999 {
				t.Errorf("latency summary: %+v", rep.Latency)
			}
			if cfg.Stream && rep.TTFT.N != wantCalls {
				t.Errorf("ttft samples: %d, want %d", rep.TTFT.N, wantCalls)
			}
			// Open: each rollout's calls have the sequence ids 1..OpenTurns
			// (in any order: calls due 2 ms apart may arrive out of order).
			if cfg.Mode == load.ModeOpen {
				ids := map[string][]string{}
				for _, c := range res.Calls {
					ids[c.RolloutID] = append(ids[c.RolloutID], c.SequenceID)
				}
				perRollout := max(cfg.OpenTurns, 1)
				if len(ids) != cfg.Requests/perRollout {
					t.Errorf("%d rollouts, want %d", len(ids), cfg.Requests/perRollout)
				}
				for r, got := range ids {
					slices.Sort(got)
					want := make([]string, perRollout)
					for i := range want {
						want[i] = itoa(i + 1)
					}
					slices.Sort(want) // as strings, as got
					if !slices.Equal(got, want) {
						t.Errorf("rollout %s: sequence ids %v, want %v", r, got, want)
					}
				}
			}
			for _, c := range res.Calls {
				if c.RequestID == "" || c.SequenceID == "" {
					t.Fatalf("call %+v: no x-request-id / x-sequence-id", c)
				}
				if cfg.Mode == load.ModeClosed && c.SequenceID != itoa(c.Turn+1) {
					t.Errorf("rollout %s turn %d: sequence id %s", c.RolloutID, c.Turn, c.SequenceID)
				}
			}
			capt, err := load.Verify(context.Background(), s.store, res, 15*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !capt.OK() || capt.Expected != wantCalls || capt.Found != wantCalls || capt.Extra != 0 {
				t.Fatalf("capture: %+v", capt)
			}
		})
	}
}

// TestRunDirect runs against the mock itself (plain paths): no request ids.
func TestRunDirect(t *testing.T) {
	s := newStack(t, openSQLite(t))
	res, err := load.Run(context.Background(), load.Config{BaseURL: s.mockURL, PathStyle: load.PathPlain, Agents: 2, Turns: 4, Rollouts: 3, ToolEvery: 3, Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	rep := res.Summary()
	// turns 0 and 3 of each rollout ask for a tool; turn 1 sends its result.
	if rep.OK != 12 || rep.Errors != 0 || rep.ToolCalls != 6 {
		t.Fatalf("report: %+v", rep)
	}
	capt, err := load.Verify(context.Background(), s.store, res, 0)
	if err != nil {
		t.Fatal(err)
	}
	if capt.NoRequestID != 12 || capt.Expected != 0 || capt.OK() {
		t.Fatalf("capture of uncaptured calls: %+v", capt)
	}
}

// TestRunErrors counts failures instead of hiding them.
func TestRunErrors(t *testing.T) {
	s := newStack(t, openSQLite(t))
	cases := []struct {
		fail   string
		stream bool
		kind   string
	}{
		{"status=500", false, "HTTP 500"},
		{"status=429", true, "HTTP 429"},
		{"midstream", true, "stream ended without [DONE]"},
		{"disconnect", false, "transport"},
	}
	for _, tc := range cases {
		t.Run(tc.fail, func(t *testing.T) {
			res, err := load.Run(context.Background(), load.Config{BaseURL: s.mockURL, PathStyle: load.PathPlain, Agents: 2, Turns: 3, Rollouts: 2,
				Stream: tc.stream, Header: map[string][]string{"X-Mock-Fail": {tc.fail}}})
			if err != nil {
				t.Fatal(err)
			}
			rep := res.Summary()
			// A rollout stops at its first failed call.
			if rep.Requests != 2 || rep.Errors != 2 || rep.ErrorKinds[tc.kind] != 2 || rep.Throughput != 0 {
				t.Fatalf("report: %+v", rep)
			}
		})
	}
	if _, err := load.Run(context.Background(), load.Config{BaseURL: s.mockURL, Mode: "sideways"}); err == nil {
		t.Fatal("bad mode accepted")
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
