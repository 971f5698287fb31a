package gateway_test

import (
	"context"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// heldSink keeps rows by span id; while hold is open it blocks every write,
// as a store that is slow when the process is killed.
type heldSink struct {
	hold chan struct{}
	mu   sync.Mutex
	rows map[string][]export.Call
}

func (h *heldSink) Write(ctx context.Context, b *export.Batch) error {
	select {
	case <-h.hold:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range b.Calls {
		h.rows[c.SpanID] = append(h.rows[c.SpanID], c)
	}
	return nil
}

// TestWALLogsCallsBeforeTheirAnswerEnds: with a WAL, a call's record is in
// the log by the time its client has the whole answer (streamed and not,
// n=2, completions, responses), even though its rows are stuck behind a slow sink; a second
// pipeline replaying that log (the next process after a kill) stores the
// rows the live call stores.
func TestWALLogsCallsBeforeTheirAnswerEnds(t *testing.T) {
	dir := t.TempDir()
	wal, err := capture.OpenWAL(capture.WALConfig{Dir: dir}, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	live := &heldSink{hold: make(chan struct{}), rows: map[string][]export.Call{}}
	m := metrics.New()
	// One worker, as the replay's order is the log's: with several, two
	// calls taken at once are assembled in either order, and turn_kind
	// (the tracker's view of the attempt's previous call) differs between
	// the live rows and the replayed ones (seen: "unordered" live, "first"
	// replayed).
	pipe := capture.NewPipeline(capture.Config{FlushInterval: time.Millisecond, WAL: wal, Workers: 1}, []capture.NamedSink{{Name: "held", Sink: live}}, m, nil)
	ms, base, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{Listen: ln.Addr().String(), UpstreamTimeout: 20 * time.Second, InjectLogprobs: true,
		SequenceStore: gatewaytest.SequenceStore(t),
		Backends:      []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "mock-1", URL: base, Kind: "vllm"}}}}}
	gw, err := gateway.New(cfg, pipe, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(ln)
	url := "http://" + ln.Addr().String()

	bodies := []string{
		`{"model":"m","messages":[{"role":"user","content":"one"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"two"}],"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"three"}],"stream":true,"n":2,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":"four","stream":true}`,
		`{"model":"m","input":"five","stream":true}`,
	}
	paths := []string{"/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions", "/v1/completions", "/v1/responses"}
	var spans []string
	for i, body := range bodies {
		r := do(t, "POST", url+"/rollout/r/attempt/a"+paths[i], body)
		if r.status != 200 {
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
		spans = append(spans, r.header.Get("x-request-id"))
		// The client has the whole answer: the call is logged.
		if st := wal.Stats(); st.Pending != i+1 {
			t.Fatalf("after call %d answered: %d calls in the WAL, want %d", i, st.Pending, i+1)
		}
	}

	// The "next process" replays the log while the live rows are still held.
	again, err := capture.OpenWAL(capture.WALConfig{Dir: dir}, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	replay := &heldSink{hold: make(chan struct{}), rows: map[string][]export.Call{}}
	close(replay.hold)
	pipe2 := capture.NewPipeline(capture.Config{FlushInterval: time.Millisecond, WAL: again}, []capture.NamedSink{{Name: "replay", Sink: replay}}, metrics.New(), nil)
	if err := pipe2.ReplayWAL(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pipe2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	close(live.hold)
	if err := gw.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pipe.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i, span := range spans {
		want, got := live.rows[span], replay.rows[span]
		if len(want) == 0 || len(want) != len(got) {
			t.Fatalf("call %d: %d live rows, %d replayed", i, len(want), len(got))
		}
		for j := range want {
			// A stream is logged when its end arrives, before the gateway
			// closes it: its end time may be a little earlier.
			if want[j].Stream {
				got[j].EndTimeUnixNano = want[j].EndTimeUnixNano
			}
			if !reflect.DeepEqual(want[j], got[j]) {
				t.Errorf("call %d row %d replayed differs:\n got %+v\nwant %+v", i, j, got[j], want[j])
			}
		}
		if !strings.Contains(want[0].ResponseBody, "choices") && !strings.Contains(want[0].ResponseBody, "output") {
			t.Errorf("call %d: response body %q", i, want[0].ResponseBody)
		}
	}
	if st := wal.Stats(); st.Pending != 0 {
		t.Errorf("%d calls still unacknowledged after the live pipeline closed", st.Pending)
	}
}
