package storetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// SampleBatch is a little of everything: two tasks, three attempts, streamed
// and failed calls, episode and step rewards, rollout status updates.
func SampleBatch() *export.Batch {
	b := &export.Batch{}
	for i, a := range []struct{ rollout, attempt, task string }{{"r1", "a1", "t1"}, {"r2", "a1", "t1"}, {"r3", "a1", "t2"}} {
		for seq := uint64(1); seq <= 2; seq++ {
			c := FullCall(a.rollout, a.attempt, seq, 0)
			c.TaskID = a.task
			b.Calls = append(b.Calls, c)
		}
		failed := EmptyCall(a.rollout, a.attempt, 3)
		failed.TaskID, failed.Backend, failed.HTTPStatus, failed.Error = a.task, "http://127.0.0.1:8001", 502, "backend unavailable"
		failed.Model, failed.Endpoint = "Qwen/Qwen3-0.6B", "/v1/chat/completions"
		b.Calls = append(b.Calls, failed)
		b.Rewards = append(b.Rewards,
			export.Reward{RolloutID: a.rollout, AttemptID: a.attempt, Name: "primary", Value: float64(i) / 2, Source: "api", TimeUnixNano: 1_700_000_100_000_000_000},
			export.Reward{RolloutID: a.rollout, AttemptID: a.attempt, SequenceID: 1, Name: "format", Value: 0.1, Source: "air:format", TimeUnixNano: 1_700_000_050_000_000_000})
		b.Rollouts = append(b.Rollouts,
			export.Rollout{RolloutID: a.rollout, AttemptID: a.attempt, TaskID: a.task, Status: "running", Metadata: "{}", CreatedUnixNano: 1_700_000_000_000_000_000, UpdatedUnixNano: 1_700_000_000_000_000_000},
			export.Rollout{RolloutID: a.rollout, AttemptID: a.attempt, TaskID: a.task, Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1_700_000_000_000_000_000, UpdatedUnixNano: 1_700_000_200_000_000_000})
	}
	return b
}

// RunQueryFiles writes SampleBatch to s and runs every *.sql file in dir
// (the saved queries in deploy/sql), each as a subtest that fails when the
// query errors or returns no rows.
func RunQueryFiles(t *testing.T, s export.Store, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no .sql files in %s", dir)
	}
	if err := s.Write(context.Background(), SampleBatch()); err != nil {
		t.Fatalf("Write: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			query, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Query(context.Background(), strings.TrimSpace(string(query)))
			if err != nil {
				t.Fatalf("%s: %v", s.Name(), err)
			}
			if len(res.Rows) == 0 || len(res.Columns) == 0 {
				t.Fatalf("%s: no rows (columns %q)", s.Name(), res.Columns)
			}
			var b strings.Builder
			if err := export.WriteTable(&b, res); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s:\n%s", s.Name(), b.String())
		})
	}
}
