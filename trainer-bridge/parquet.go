package bridge

import (
	"fmt"
	"io"
	"math"

	"github.com/parquet-go/parquet-go"
)

// parquetRow is one Parquet row: ids and masks as LIST<int32>, logprobs as
// LIST<float>, the scalars as their natural types (columns named as in Row).
type parquetRow struct {
	RolloutID     string    `parquet:"rollout_id"`
	AttemptID     string    `parquet:"attempt_id"`
	TaskID        string    `parquet:"task_id"`
	AgentName     string    `parquet:"agent_name"`
	PolicyVersion string    `parquet:"policy_version"`
	UID           string    `parquet:"uid"`
	ChoiceIndex   int32     `parquet:"choice_index"`
	SequenceIDs   []int64   `parquet:"sequence_ids,list"`
	PromptIDs     []int32   `parquet:"prompt_ids,list"`
	ResponseIDs   []int32   `parquet:"response_ids,list"`
	ResponseMask  []int32   `parquet:"response_mask,list"`
	Logprobs      []float32 `parquet:"rollout_log_probs,list"`
	Reward        float64   `parquet:"reward"`
	Advantage     float64   `parquet:"advantage"`
	Trimmed       bool      `parquet:"trimmed"`
	TokenSource   string    `parquet:"token_source"`
}

// WriteParquet writes one row per sample (zstd-compressed, row groups of
// up to 4096 rows).
func WriteParquet(w io.Writer, samples []*Sample) error {
	return writeAll(NewParquetWriter(w), samples)
}

// NewParquetWriter streams samples into a Parquet file, one row group per
// 4096 rows.
func NewParquetWriter(w io.Writer) SampleWriter {
	return &parquetWriter{pw: parquet.NewGenericWriter[parquetRow](w, parquet.Compression(&parquet.Zstd)),
		buf: make([]parquetRow, 0, parquetChunk)}
}

const parquetChunk = 4096

type parquetWriter struct {
	pw  *parquet.GenericWriter[parquetRow]
	buf []parquetRow
	n   int
}

func (p *parquetWriter) Write(s *Sample) error {
	if err := fitsInt32(s.Prompt, s.Response); err != nil {
		return fmt.Errorf("bridge: sample %d (%s): %w", p.n, s.RolloutID, err)
	}
	p.n++
	p.buf = append(p.buf, toParquet(s))
	if len(p.buf) == parquetChunk {
		return p.flush()
	}
	return nil
}

func (p *parquetWriter) flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	if _, err := p.pw.Write(p.buf); err != nil {
		return fmt.Errorf("bridge: writing parquet rows: %w", err)
	}
	if err := p.pw.Flush(); err != nil {
		return fmt.Errorf("bridge: writing parquet row group: %w", err)
	}
	p.buf = p.buf[:0]
	return nil
}

func (p *parquetWriter) Close() error {
	if err := p.flush(); err != nil {
		return err
	}
	if err := p.pw.Close(); err != nil {
		return fmt.Errorf("bridge: closing parquet: %w", err)
	}
	return nil
}

func toParquet(s *Sample) parquetRow {
	r := parquetRow{RolloutID: s.RolloutID, AttemptID: s.AttemptID, TaskID: s.TaskID, AgentName: s.AgentName,
		PolicyVersion: s.PolicyVersion, UID: s.GroupUID, ChoiceIndex: int32(s.ChoiceIndex),
		SequenceIDs: make([]int64, len(s.SequenceIDs)), PromptIDs: i32(s.Prompt), ResponseIDs: i32(s.Response),
		ResponseMask: make([]int32, len(s.ResponseMask)), Logprobs: s.Logprobs,
		Reward: s.Reward, Advantage: s.Advantage, Trimmed: s.Trimmed, TokenSource: s.TokenSource}
	if r.Logprobs == nil {
		r.Logprobs = []float32{}
	}
	for i, q := range s.SequenceIDs {
		r.SequenceIDs[i] = int64(q)
	}
	for i, m := range s.ResponseMask {
		r.ResponseMask[i] = int32(m)
	}
	return r
}

// fitsInt32 rejects token ids that LIST<int32> cannot hold (none in real vocabularies).
func fitsInt32(lists ...[]uint32) error {
	for _, l := range lists {
		for _, x := range l {
			if x > math.MaxInt32 {
				return fmt.Errorf("token id %d does not fit in int32", x)
			}
		}
	}
	return nil
}

func i32(xs []uint32) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}
