package bridge

import (
	"fmt"
	"io"
	"math"

	"github.com/parquet-go/parquet-go"
)

// ParquetOptions shape a Parquet file.
type ParquetOptions struct {
	// OmitLogprobs leaves the rollout_log_probs column out of the file.
	OmitLogprobs bool
}

// parquetHead and parquetTail are the columns of every Parquet row, named
// as the safetensors keys (Tensors) but unpadded: ids and masks as
// LIST<int32>, per-token floats as LIST<float>, one entry per response
// token. Between them parquetRow has rollout_log_probs; parquetRowNoLP
// (ParquetOptions.OmitLogprobs) has not.
type parquetHead struct {
	RolloutID     string  `parquet:"rollout_id"`
	AttemptID     string  `parquet:"attempt_id"`
	TaskID        string  `parquet:"task_id"`
	AgentName     string  `parquet:"agent_name"`
	PolicyVersion string  `parquet:"policy_version"`
	UID           string  `parquet:"uid"`
	ChoiceIndex   int32   `parquet:"choice_index"`
	SequenceIDs   []int64 `parquet:"sequence_ids,list"`
	TokenSource   string  `parquet:"token_source"`
	HasLogprobs   bool    `parquet:"has_logprobs"`
	Truncated     bool    `parquet:"truncated"`
	Trimmed       bool    `parquet:"trimmed"`
	PromptIDs     []int32 `parquet:"prompts,list"`
	ResponseIDs   []int32 `parquet:"responses,list"`
	ResponseMask  []int32 `parquet:"response_mask,list"`
}

type parquetTail struct {
	Scores     []float32 `parquet:"token_level_scores,list"` // the reward on the last response token
	Advantages []float32 `parquet:"advantages,list"`         // the advantage times response_mask
	Returns    []float32 `parquet:"returns,list"`            // = advantages
	// MixedPolicy: more than one policy version sampled the response
	// (Sample.MixedPolicy); last, so columns read by position keep theirs.
	MixedPolicy bool `parquet:"mixed_policy"`
}

type parquetRow struct {
	parquetHead
	Logprobs []float32 `parquet:"rollout_log_probs,list"`
	parquetTail
}

type parquetRowNoLP struct {
	parquetHead
	parquetTail
}

// WriteParquet writes one row per sample (zstd-compressed, row groups of
// up to 4096 rows). Columns: rollout_id, attempt_id, task_id, agent_name,
// policy_version, uid, choice_index, sequence_ids, token_source,
// has_logprobs, truncated, trimmed, prompts, responses, response_mask,
// rollout_log_probs (unless o.OmitLogprobs), token_level_scores,
// advantages, returns, mixed_policy.
func WriteParquet(w io.Writer, samples []*Sample, o ParquetOptions) error {
	return writeAll(NewParquetWriter(w, o), samples)
}

// NewParquetWriter streams samples into a Parquet file, one row group per
// 4096 rows.
func NewParquetWriter(w io.Writer, o ParquetOptions) SampleWriter {
	if o.OmitLogprobs {
		return newParquetWriter(w, func(s *Sample) parquetRowNoLP {
			r := toParquet(s)
			return parquetRowNoLP{r.parquetHead, r.parquetTail}
		})
	}
	return newParquetWriter(w, toParquet)
}

func newParquetWriter[T any](w io.Writer, conv func(*Sample) T) *parquetWriter[T] {
	return &parquetWriter[T]{pw: parquet.NewGenericWriter[T](w, parquet.Compression(&parquet.Zstd)),
		buf: make([]T, 0, parquetChunk), conv: conv}
}

const parquetChunk = 4096

type parquetWriter[T any] struct {
	pw   *parquet.GenericWriter[T]
	buf  []T
	conv func(*Sample) T
	n    int
}

func (p *parquetWriter[T]) Write(s *Sample) error {
	if err := fitsInt32(s.Prompt, s.Response); err != nil {
		return fmt.Errorf("bridge: sample %d (%s): %w", p.n, s.RolloutID, err)
	}
	p.n++
	p.buf = append(p.buf, p.conv(s))
	if len(p.buf) == parquetChunk {
		return p.flush()
	}
	return nil
}

func (p *parquetWriter[T]) flush() error {
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

func (p *parquetWriter[T]) Close() error {
	if err := p.flush(); err != nil {
		return err
	}
	if err := p.pw.Close(); err != nil {
		return fmt.Errorf("bridge: closing parquet: %w", err)
	}
	return nil
}

func toParquet(s *Sample) parquetRow {
	n := len(s.Response)
	r := parquetRow{parquetHead: parquetHead{RolloutID: s.RolloutID, AttemptID: s.AttemptID, TaskID: s.TaskID, AgentName: s.AgentName,
		PolicyVersion: s.PolicyVersion, UID: s.GroupUID, ChoiceIndex: int32(s.ChoiceIndex),
		SequenceIDs: make([]int64, len(s.SequenceIDs)), TokenSource: s.TokenSource, HasLogprobs: s.HasLogprobs,
		Truncated: s.Truncated, Trimmed: s.Trimmed, PromptIDs: i32(s.Prompt), ResponseIDs: i32(s.Response),
		ResponseMask: make([]int32, len(s.ResponseMask))},
		Logprobs:    s.Logprobs,
		parquetTail: parquetTail{Scores: make([]float32, n), Advantages: make([]float32, n), Returns: make([]float32, n), MixedPolicy: s.MixedPolicy}}
	if r.Logprobs == nil {
		r.Logprobs = []float32{}
	}
	for i, q := range s.SequenceIDs {
		r.SequenceIDs[i] = int64(q)
	}
	for i, m := range s.ResponseMask {
		r.ResponseMask[i] = int32(m)
		if m == 1 && i < n {
			r.Advantages[i] = float32(s.Advantage)
		}
	}
	copy(r.Returns, r.Advantages)
	if n > 0 {
		r.Scores[n-1] = float32(s.Reward)
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
