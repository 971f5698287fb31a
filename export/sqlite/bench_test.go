package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// benchCall is a row shaped like those `rollgate bench` stores (32 agents,
// 4-turn rollouts, 32-token answers): an ≈0.8 KB request, an ≈1.7 KB
// response with ids and logprobs, ≈160 prompt ids and 32 output ids.
func benchCall(i int) export.Call {
	prompt := make([]uint32, 160)
	for j := range prompt {
		prompt[j] = uint32((i+j)*7919) % 151936
	}
	resp := make([]uint32, 32)
	lp := make([]float32, 32)
	for j := range resp {
		resp[j] = uint32((i*31+j)*104729) % 151936
		lp[j] = -float32(j%7) / 3
	}
	// Random keys, as real span ids and (uuid4) rollout ids are: every
	// index of llm_calls takes them at random places.
	rollout := fmt.Sprintf("%016x", uint64(i/4)*0xbf58476d1ce4e5b9)
	return export.Call{
		SpanID: fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15), TraceID: fmt.Sprintf("%032x", i),
		RolloutID: rollout, AttemptID: fmt.Sprintf("%016x", uint64(i/4)*0x94d049bb133111eb), TaskID: "task", AgentName: "agent",
		SequenceID: uint64(i%4 + 1), StartTimeUnixNano: 1_700_000_000_000_000_000 + uint64(i)*1000,
		EndTimeUnixNano: 1_700_000_000_002_000_000 + uint64(i)*1000, TTFTNano: 900_000,
		Endpoint: "/v1/chat/completions", Model: "mock-model", Backend: "default", Stream: true, HTTPStatus: 200,
		RequestBody:     `{"model":"mock-model","messages":[` + strings.Repeat(`{"role":"user","content":"tell me about the weather in some city, please"},`, 10) + `{"role":"user","content":"go"}]}`,
		ResponseBody:    `{"id":"chatcmpl-x","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("lorem ipsum ", 120) + `"},"finish_reason":"stop"}]}`,
		ResponseMessage: `{"role":"assistant","content":"` + strings.Repeat("lorem ipsum ", 16) + `"}`,
		PromptTokenIDs:  prompt, ResponseTokenIDs: resp, ResponseLogprobs: lp,
		TokenSource: export.TokenSourceEngine, FinishReason: "stop", PromptTokens: 160, CompletionTokens: 32,
		TurnKind: "extends", APIKeyName: "",
	}
}

// BenchmarkWriteBatch measures Write of 1,000-row batches (the capture
// pipeline's batch size under load) into a file that keeps growing, as the
// gateway's store does; ns/op is per batch, row/s is reported.
func BenchmarkWriteBatch(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const n = 1000
	batch := &export.Batch{Calls: make([]export.Call, n)}
	next := 0
	// ROLLGATE_BENCH_PREFILL=N first stores N small rows (keys only), so
	// the indexes are as large as in a long run's file.
	if v, _ := strconv.Atoi(os.Getenv("ROLLGATE_BENCH_PREFILL")); v > 0 {
		for next < v {
			for i := range batch.Calls {
				c := benchCall(next)
				batch.Calls[i] = export.Call{SpanID: c.SpanID, RolloutID: c.RolloutID, AttemptID: c.AttemptID, SequenceID: c.SequenceID}
				next++
			}
			if err := s.Write(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
	}
	start := next
	b.ReportAllocs()
	for b.Loop() {
		for i := range batch.Calls {
			batch.Calls[i] = benchCall(next)
			next++
		}
		if err := s.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(next-start), "ns/row")
}
