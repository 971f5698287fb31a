package bridge

import (
	"bufio"
	"fmt"
	"io"
)

// Row is the JSON shape of a Sample (JSONL lines and leased samples).
type Row struct {
	RolloutID     string    `json:"rollout_id"`
	AttemptID     string    `json:"attempt_id"`
	TaskID        string    `json:"task_id"`
	AgentName     string    `json:"agent_name"`
	PolicyVersion string    `json:"policy_version"`
	UID           string    `json:"uid"`
	ChoiceIndex   uint32    `json:"choice_index"`
	SequenceIDs   []uint64  `json:"sequence_ids"`
	PromptIDs     []uint32  `json:"prompt_ids"`
	ResponseIDs   []uint32  `json:"response_ids"`
	ResponseMask  []uint8   `json:"response_mask"`
	Logprobs      []float32 `json:"rollout_log_probs"`
	Reward        float64   `json:"reward"`
	Advantage     float64   `json:"advantage"`
	Trimmed       bool      `json:"trimmed"`
	// Truncated: the response was cut at the maximum (Sample.Truncated).
	Truncated bool `json:"truncated"`
	// HasLogprobs: false when rollout_log_probs holds zeros that are not
	// logprobs (Sample.HasLogprobs).
	HasLogprobs bool `json:"has_logprobs"`
	// TokenSource is engine, tokenize or retokenized (Sample.TokenSource):
	// filter on it to train only on ids an engine sampled.
	TokenSource string `json:"token_source"`
}

// ToRow converts a Sample to its row form. Nil slices become empty ones.
func (s *Sample) ToRow() Row {
	r := Row{RolloutID: s.RolloutID, AttemptID: s.AttemptID, TaskID: s.TaskID, AgentName: s.AgentName,
		PolicyVersion: s.PolicyVersion, UID: s.GroupUID, ChoiceIndex: s.ChoiceIndex, SequenceIDs: s.SequenceIDs,
		PromptIDs: s.Prompt, ResponseIDs: s.Response, ResponseMask: s.ResponseMask, Logprobs: s.Logprobs,
		Reward: s.Reward, Advantage: s.Advantage, Trimmed: s.Trimmed, Truncated: s.Truncated,
		HasLogprobs: s.HasLogprobs, TokenSource: s.TokenSource}
	if r.SequenceIDs == nil {
		r.SequenceIDs = []uint64{}
	}
	if r.PromptIDs == nil {
		r.PromptIDs = []uint32{}
	}
	if r.ResponseIDs == nil {
		r.ResponseIDs = []uint32{}
	}
	if r.ResponseMask == nil {
		r.ResponseMask = []uint8{}
	}
	if r.Logprobs == nil {
		r.Logprobs = []float32{}
	}
	return r
}

// MarshalJSON renders a sample as one JSONL line holds it (without the newline).
func (s *Sample) MarshalJSON() ([]byte, error) { return s.appendJSON(nil) }

// SampleWriter writes samples one at a time (the streaming form of the
// Write* functions); Close flushes what is buffered.
type SampleWriter interface {
	Write(*Sample) error
	Close() error
}

// NewJSONLWriter writes one JSON object per sample per line.
func NewJSONLWriter(w io.Writer) SampleWriter {
	return &jsonlWriter{bw: bufio.NewWriterSize(w, 1<<16)}
}

type jsonlWriter struct {
	bw   *bufio.Writer
	line []byte
	n    int
}

func (j *jsonlWriter) Write(s *Sample) error {
	line, err := s.appendJSON(j.line[:0])
	if err != nil {
		return fmt.Errorf("bridge: writing sample %d: %w", j.n, err)
	}
	j.line = append(line, '\n')
	if _, err := j.bw.Write(j.line); err != nil {
		return fmt.Errorf("bridge: writing sample %d: %w", j.n, err)
	}
	j.n++
	return nil
}

func (j *jsonlWriter) Close() error {
	if err := j.bw.Flush(); err != nil {
		return fmt.Errorf("bridge: writing samples: %w", err)
	}
	return nil
}

// WriteJSONL writes one JSON object per sample per line.
func WriteJSONL(w io.Writer, samples []*Sample) error {
	return writeAll(NewJSONLWriter(w), samples)
}

func writeAll(sw SampleWriter, samples []*Sample) error {
	for _, s := range samples {
		if err := sw.Write(s); err != nil {
			return err
		}
	}
	return sw.Close()
}
