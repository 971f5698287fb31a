package bridge

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// benchStore fills store with rollouts x 5 calls, one succeeded attempt and
// reward each, of the data mode (benchDataMode): the default's calls all
// have the same 512-token prompt and 128-token response; agentic's are
// agenticData's trajectories, and their rollouts' metadata names the mode
// (benchMetadata).
func benchStore(b testing.TB, s export.Store, rollouts int, mode string) {
	const turns = 5
	prompt, resp, lp := make([]uint32, 512), make([]uint32, 128), make([]float32, 128)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	var gen *agenticData
	if mode == benchDataAgentic {
		gen = newAgenticData()
	}
	batch := &export.Batch{}
	size := 0 // the batch's calls' ids, logprobs and bodies, in bytes
	for r := range rollouts {
		ro := fmt.Sprintf("r%06d", r)
		if gen != nil {
			n := len(batch.Calls)
			batch.Calls = gen.rollout(batch.Calls, r, ro)
			for _, c := range batch.Calls[n:] {
				size += 4*(len(c.PromptTokenIDs)+len(c.ResponseTokenIDs)+len(c.ResponseLogprobs)) + len(c.RequestBody) + len(c.ResponseMessage)
			}
		} else {
			for t := range turns {
				batch.Calls = append(batch.Calls, export.Call{SpanID: fmt.Sprint(ro, t), RolloutID: ro, AttemptID: "a", TaskID: fmt.Sprint("t", r%100),
					SequenceID: uint64(t + 1), StartTimeUnixNano: uint64(r*10 + t), HTTPStatus: 200, TokenSource: export.TokenSourceEngine,
					RequestBody: `{"messages":[{"role":"user","content":"hi"}]}`, ResponseMessage: `{"role":"assistant","content":"answer"}`,
					PromptTokenIDs: prompt, ResponseTokenIDs: resp, ResponseLogprobs: lp, FinishReason: "stop"})
			}
		}
		batch.Rollouts = append(batch.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a", Status: "succeeded", Metadata: benchMetadata(mode), UpdatedUnixNano: 1})
		batch.Rewards = append(batch.Rewards, export.Reward{RolloutID: ro, AttemptID: "a", Name: "primary", Value: float64(r % 3), Source: "api"})
		// 5000 calls, or fewer when they are large (agentic: about 1,000).
		if len(batch.Calls) >= 5000 || size >= 32<<20 {
			if err := s.Write(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch, size = &export.Batch{}, 0
		}
	}
	if err := s.Write(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
}

// benchDataMode is ROLLGATE_BENCH_DATA: benchDataDefault (unset) or
// benchDataAgentic.
func benchDataMode(b *testing.B) string {
	switch m := os.Getenv("ROLLGATE_BENCH_DATA"); m {
	case "", benchDataDefault:
		return benchDataDefault
	case benchDataAgentic:
		return m
	default:
		b.Fatalf("ROLLGATE_BENCH_DATA=%q: want %s (or unset) or %s", m, benchDataDefault, benchDataAgentic)
		return ""
	}
}

// benchMetadata is the rollouts' metadata in a data mode: the default's is
// "{}" as it always was, the others name their mode, so that a kept
// database (ROLLGATE_BENCH_DATABASE) tells which data it holds.
func benchMetadata(mode string) string {
	if mode == benchDataDefault {
		return "{}"
	}
	return `{"bench_data":"` + mode + `"}`
}

// benchRollouts is 2000 unless ROLLGATE_BENCH_ROLLOUTS says otherwise
// (20000 = 10^5 transitions, 200000 = 10^6).
func benchRollouts() int {
	if v, err := strconv.Atoi(os.Getenv("ROLLGATE_BENCH_ROLLOUTS")); err == nil && v > 0 {
		return v
	}
	return 2000
}

// benchOptions are the benchmarks' Build options: GRPO, AIR on (its
// default rules), every other option its default.
func benchOptions() Options {
	e, _ := air.New(air.DefaultConfig())
	return Options{Selection: DefaultSelection(), Estimator: advantage.GRPO, AIR: e}
}

// benchBuild times Build (GRPO, AIR on) and reports transitions/s and the
// peak Go heap in use during the builds.
func benchBuild(b *testing.B, s export.Store, rollouts int, stream bool) {
	o := benchOptions()
	var emitted int
	if stream {
		w := NewJSONLWriter(io.Discard)
		o.Emit = func(s *Sample) error { emitted++; return w.Write(s) }
	}
	runtime.GC()
	// Reset the kernel's peak-RSS mark (VmHWM) so it counts the builds,
	// not the filling of the store.
	resetRSS := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // the memory sampler's period, not a wait
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	b.ReportAllocs()
	if path := os.Getenv("ROLLGATE_BENCH_CPUPROFILE"); path != "" {
		// The builds' profile alone, without the filling of the store
		// that -test.cpuprofile would mix in.
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		res, err := Build(context.Background(), s, o)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(res.Samples) + emitted; n != rollouts*5 {
			b.Fatalf("%d samples", n)
		}
		emitted = 0
	}
	cpu := processCPU() - cpu0
	close(stop)
	b.ReportMetric(float64(rollouts*5*b.N)/b.Elapsed().Seconds(), "transitions/s")
	if cpu > 0 {
		// The bridge's own CPU (user+sys of this process, every thread),
		// which the machine's load does not change the way it changes
		// the rate; the store's server is another process.
		b.ReportMetric(float64(cpu.Microseconds())/float64(rollouts*5*b.N), "cpu-µs/transition")
	}
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
	if kb := vmHWM(); resetRSS && kb > 0 {
		b.ReportMetric(float64(kb)/1024, "peak-RSS-MiB")
	}
}

// processCPU is the user+sys CPU time this process has used (all its
// threads), 0 when unknown.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// vmHWM is the process's peak resident set size in KiB (Linux), 0 when unknown.
func vmHWM() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// BenchmarkBuildSQLite assembles transitions (GRPO, AIR on) from an embedded
// store of 2000 rollouts x 5 calls (512-token prompts, 128-token responses);
// ROLLGATE_BENCH_ROLLOUTS sets another number of rollouts, and
// ROLLGATE_BENCH_DATA=agentic multi-turn tool-using trajectories instead
// (agenticData: prompts growing from about 512 to at most 1,504 tokens,
// 64-256-token responses, ids over Qwen's vocabulary, negative logprobs,
// requests repeating the conversation).
func BenchmarkBuildSQLite(b *testing.B) {
	rollouts, mode := benchRollouts(), benchDataMode(b)
	s, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchStore(b, s, rollouts, mode)
	benchBuild(b, s, rollouts, false)
}

// BenchmarkBuildSQLiteStream is BenchmarkBuildSQLite writing JSONL as it
// goes (Options.Emit): one pass over the store, the samples in a spill file
// until the advantages are known, memory flat.
func BenchmarkBuildSQLiteStream(b *testing.B) {
	rollouts, mode := benchRollouts(), benchDataMode(b)
	s, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchStore(b, s, rollouts, mode)
	benchBuild(b, s, rollouts, true)
}

// BenchmarkBuildClickHouse is BenchmarkBuildSQLite on ClickHouse (the server
// in ROLLGATE_TEST_CLICKHOUSE_DSN, a fresh database).
func BenchmarkBuildClickHouse(b *testing.B) {
	dsn := os.Getenv(testenv.EnvClickHouseDSN)
	if dsn == "" {
		b.Fatalf("set %s to a ClickHouse server (scripts/test starts one)", testenv.EnvClickHouseDSN)
	}
	rollouts, mode := benchRollouts(), benchDataMode(b)
	// ROLLGATE_BENCH_DATABASE names a database to keep between runs: it
	// is filled when it does not hold the rollouts yet, else used as it is
	// (when it holds the same data mode).
	db := os.Getenv("ROLLGATE_BENCH_DATABASE")
	if db == "" {
		db = fmt.Sprint("bench_build_", mode, "_", rollouts, "_", time.Now().UnixNano())
	}
	s, err := clickhouse.Open(context.Background(), testenv.FreshDatabase(dsn, db), clickhouse.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	res, err := s.Query(context.Background(), "SELECT count() FROM llm_calls")
	if err != nil {
		b.Fatal(err)
	}
	if res.Rows[0][0] != strconv.Itoa(rollouts*5) {
		if res.Rows[0][0] != "0" {
			b.Fatalf("database %s holds %s calls, not %d: name another", db, res.Rows[0][0], rollouts*5)
		}
		benchStore(b, s, rollouts, mode)
		// The parts merged, as a server that is not inserting has them:
		// no merge runs during the builds.
		opts, err := ch.ParseDSN(testenv.FreshDatabase(dsn, db))
		if err != nil {
			b.Fatal(err)
		}
		conn, err := ch.Open(opts)
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range []string{"llm_calls", "rollouts", "rewards"} {
			if err := conn.Exec(context.Background(), "OPTIMIZE TABLE "+t+" FINAL"); err != nil {
				b.Fatal(err)
			}
		}
		conn.Close()
	}
	res, err = s.Query(context.Background(), "SELECT metadata FROM rollouts LIMIT 1")
	if err != nil {
		b.Fatal(err)
	}
	if len(res.Rows) != 1 || res.Rows[0][0] != benchMetadata(mode) {
		b.Fatalf("database %s was not filled with ROLLGATE_BENCH_DATA=%s (a rollout's metadata is %v, not %s): name another", db, mode, res.Rows, benchMetadata(mode))
	}
	cpu0 := serverCPU(b, s)
	benchBuild(b, s, rollouts, os.Getenv("ROLLGATE_BENCH_STREAM") != "")
	// The server's CPU for the builds' queries (its query threads' user
	// and system time, system.events), which shares the machine with the
	// bridge when the server is local.
	b.ReportMetric(float64(serverCPU(b, s)-cpu0)/float64(rollouts*5*b.N), "server-cpu-µs/transition")
}

// serverCPU is the user and system CPU time, in µs, that the ClickHouse
// server's query threads have used since it started.
func serverCPU(b *testing.B, s *clickhouse.Store) int64 {
	res, err := s.Query(context.Background(), "SELECT toInt64(sum(value)) FROM system.events WHERE event IN ('UserTimeMicroseconds', 'SystemTimeMicroseconds')")
	if err != nil || len(res.Rows) != 1 {
		b.Fatalf("server CPU from system.events: %v", err)
	}
	n, err := strconv.ParseInt(res.Rows[0][0], 10, 64)
	if err != nil {
		b.Fatalf("server CPU from system.events: %v", err)
	}
	return n
}
