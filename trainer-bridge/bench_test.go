package bridge

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// BenchmarkBuildSQLite assembles transitions (GRPO, AIR on) from an embedded
// store of 2000 rollouts x 5 calls (512-token prompts, 128-token responses);
// ROLLGATE_BENCH_ROLLOUTS sets another number of rollouts.
func BenchmarkBuildSQLite(b *testing.B) {
	const turns = 5
	rollouts := 2000
	if v, err := strconv.Atoi(os.Getenv("ROLLGATE_BENCH_ROLLOUTS")); err == nil && v > 0 {
		rollouts = v
	}
	s, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	prompt, resp, lp := make([]uint32, 512), make([]uint32, 128), make([]float32, 128)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	batch := &export.Batch{}
	for r := range rollouts {
		ro := fmt.Sprintf("r%05d", r)
		for t := range turns {
			batch.Calls = append(batch.Calls, export.Call{SpanID: fmt.Sprint(ro, t), RolloutID: ro, AttemptID: "a", TaskID: fmt.Sprint("t", r%100),
				SequenceID: uint64(t + 1), StartTimeUnixNano: uint64(r*10 + t), HTTPStatus: 200, TokenSource: export.TokenSourceEngine,
				RequestBody: `{"messages":[{"role":"user","content":"hi"}]}`, ResponseMessage: `{"role":"assistant","content":"answer"}`,
				PromptTokenIDs: prompt, ResponseTokenIDs: resp, ResponseLogprobs: lp, FinishReason: "stop"})
		}
		batch.Rollouts = append(batch.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 1})
		batch.Rewards = append(batch.Rewards, export.Reward{RolloutID: ro, AttemptID: "a", Name: "primary", Value: float64(r % 3), Source: "api"})
		if len(batch.Calls) >= 5000 {
			if err := s.Write(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch = &export.Batch{}
		}
	}
	if err := s.Write(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
	e, _ := air.New(air.DefaultConfig())
	o := Options{Selection: DefaultSelection(), Estimator: advantage.GRPO, AIR: e}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := Build(context.Background(), s, o)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Samples) != rollouts*turns {
			b.Fatalf("%d samples", len(res.Samples))
		}
	}
	b.ReportMetric(float64(rollouts*turns*b.N)/b.Elapsed().Seconds(), "transitions/s")
}
