package bridge

import (
	"bytes"
	"context"
	"testing"

	"github.com/parquet-go/parquet-go"
)

func TestParquetRoundTrip(t *testing.T) {
	s := fill(t)
	o := options(t)
	o.Mode = ModeTrajectories
	res, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteParquet(&buf, res.Samples, ParquetOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range f.Schema().Columns() {
		cols = append(cols, c[0])
	}
	if got := sp(cols); got != "[rollout_id attempt_id task_id agent_name policy_version uid choice_index sequence_ids token_source has_logprobs truncated trimmed prompts responses response_mask rollout_log_probs token_level_scores advantages returns mixed_policy]" {
		t.Fatalf("columns %s", got)
	}
	rows, err := parquet.Read[parquetRow](bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(res.Samples) || len(rows) != 4 {
		t.Fatalf("%d rows for %d samples", len(rows), len(res.Samples))
	}
	r := rows[0] // r1's merged trajectory
	if sp(r.RolloutID, r.UID, r.SequenceIDs, r.PromptIDs, r.ResponseIDs, r.ResponseMask, r.Logprobs, r.Scores, r.HasLogprobs, r.Truncated) !=
		"r1 t1 [1 2] [1 2 3] [10 11 20 21 12] [1 1 0 0 1] [-0.1 -0.2 0 0 -0.3] [0 0 0 0 0.5] true false" {
		t.Fatalf("row 0: %+v", r)
	}
	for i, s := range res.Samples {
		row := rows[i]
		n := len(s.Response)
		if len(row.ResponseIDs) != n || len(row.Scores) != n || len(row.Advantages) != n || len(row.Returns) != n ||
			row.Scores[n-1] != float32(s.Reward) || row.HasLogprobs != s.HasLogprobs || row.Truncated != s.Truncated {
			t.Fatalf("row %d differs: %+v vs %+v", i, row, s)
		}
		for j := range n {
			want := float32(0)
			if s.ResponseMask[j] == 1 {
				want = float32(s.Advantage)
			}
			if row.Advantages[j] != want || row.Returns[j] != want || (j < n-1 && row.Scores[j] != 0) {
				t.Fatalf("row %d token %d: advantages %v returns %v scores %v, advantage %v", i, j, row.Advantages, row.Returns, row.Scores, s.Advantage)
			}
		}
	}

	// OmitLogprobs leaves the column out.
	buf.Reset()
	if err := WriteParquet(&buf, res.Samples, ParquetOptions{OmitLogprobs: true}); err != nil {
		t.Fatal(err)
	}
	f, err = parquet.OpenFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	cols = cols[:0]
	for _, c := range f.Schema().Columns() {
		cols = append(cols, c[0])
	}
	if got := sp(cols); got != "[rollout_id attempt_id task_id agent_name policy_version uid choice_index sequence_ids token_source has_logprobs truncated trimmed prompts responses response_mask token_level_scores advantages returns mixed_policy]" {
		t.Fatalf("columns without logprobs %s", got)
	}
	if f.NumRows() != 4 {
		t.Fatalf("%d rows", f.NumRows())
	}
}

func TestParquetRejectsHugeIDs(t *testing.T) {
	err := WriteParquet(&bytes.Buffer{}, []*Sample{{Prompt: []uint32{1 << 31}}}, ParquetOptions{})
	if err == nil {
		t.Fatal("id 2^31 accepted")
	}
}

func BenchmarkWriteParquet(b *testing.B) {
	samples := make([]*Sample, 1000)
	for i := range samples {
		samples[i] = &Sample{RolloutID: "r", TaskID: "t", GroupUID: "t", SequenceIDs: []uint64{1}, Prompt: make([]uint32, 512),
			Response: make([]uint32, 256), ResponseMask: ones(256), Logprobs: make([]float32, 256)}
	}
	b.ReportAllocs()
	for b.Loop() {
		var buf bytes.Buffer
		if err := WriteParquet(&buf, samples, ParquetOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
