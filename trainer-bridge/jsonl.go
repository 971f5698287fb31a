package bridge

import (
	"bufio"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
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
	// MixedPolicy: more than one policy version sampled the response
	// (Sample.MixedPolicy); policy_version is the latest.
	MixedPolicy bool `json:"mixed_policy"`
}

// ToRow converts a Sample to its row form. Nil slices become empty ones.
func (s *Sample) ToRow() Row {
	r := Row{RolloutID: s.RolloutID, AttemptID: s.AttemptID, TaskID: s.TaskID, AgentName: s.AgentName,
		PolicyVersion: s.PolicyVersion, UID: s.GroupUID, ChoiceIndex: s.ChoiceIndex, SequenceIDs: s.SequenceIDs,
		PromptIDs: s.Prompt, ResponseIDs: s.Response, ResponseMask: s.ResponseMask, Logprobs: s.Logprobs,
		Reward: s.Reward, Advantage: s.Advantage, Trimmed: s.Trimmed, Truncated: s.Truncated,
		HasLogprobs: s.HasLogprobs, TokenSource: s.TokenSource, MixedPolicy: s.MixedPolicy}
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
// Write* functions); Close flushes what is buffered. A writer may keep a
// sample handed to Write until Close: the caller must not change it after
// (Build never does).
type SampleWriter interface {
	Write(*Sample) error
	Close() error
}

// NewJSONLWriter writes one JSON object per sample per line. The lines are
// formatted in batches of jsonlBatch samples by up to GOMAXPROCS goroutines
// and written in order: a sample's line (hundreds of ids and logprobs as
// text) costs more than building the sample, and an export is otherwise
// bound by the one goroutine that formats. A sample that JSON cannot hold
// (a NaN or infinite reward, advantage or logprob) fails its Write, as
// encoding/json fails, with the lines before it written.
func NewJSONLWriter(w io.Writer) SampleWriter {
	return &jsonlWriter{bw: bufio.NewWriterSize(w, 1<<16)}
}

// jsonlBatch is how many samples a formatting goroutine takes at a time.
const jsonlBatch = 64

type jsonlWriter struct {
	bw     *bufio.Writer
	cur    *lineBatch
	n      int // samples taken by Write
	closed bool
	// Once the first batch is full: batches to format (work) and, in the
	// same order, to write (order); spent batches come back on free.
	work, order, free chan *lineBatch
	done              chan struct{} // the writing goroutine ended (werr is set)
	werr              error
	failed            atomic.Bool // a write failed: Write returns werr
	workers           sync.WaitGroup
}

// lineBatch is up to jsonlBatch samples and, once ready is closed, their lines.
type lineBatch struct {
	first   int // index of samples[0] among the writer's samples
	samples []*Sample
	lines   []byte
	err     error // formatting failed at a sample (lines holds those before it)
	ready   chan struct{}
}

func (j *jsonlWriter) Write(s *Sample) error {
	if j.failed.Load() { // werr is set before failed, and never again
		return j.werr
	}
	// What would fail the line fails here, before anything is queued.
	if err := s.jsonError(); err != nil {
		return fmt.Errorf("bridge: writing sample %d: %w", j.n, err)
	}
	if j.cur == nil {
		j.cur = j.newBatch()
	}
	j.cur.samples = append(j.cur.samples, s)
	j.n++
	if len(j.cur.samples) == jsonlBatch {
		j.dispatch()
	}
	return nil
}

// newBatch is a spent batch to reuse, or a new one.
func (j *jsonlWriter) newBatch() *lineBatch {
	select {
	case b := <-j.free:
		b.first, b.samples, b.lines, b.err = j.n, b.samples[:0], b.lines[:0], nil
		b.ready = make(chan struct{})
		return b
	default:
		return &lineBatch{first: j.n, samples: make([]*Sample, 0, jsonlBatch), ready: make(chan struct{})}
	}
}

// dispatch hands the current batch to the formatting goroutines, starting
// them with the first batch.
func (j *jsonlWriter) dispatch() {
	if j.work == nil {
		workers := runtime.GOMAXPROCS(0)
		j.work, j.order, j.free = make(chan *lineBatch), make(chan *lineBatch, 2*workers), make(chan *lineBatch, 3*workers)
		j.done = make(chan struct{})
		for range workers {
			j.workers.Add(1)
			go func() {
				defer j.workers.Done()
				for b := range j.work {
					b.format()
				}
			}()
		}
		go j.writeLines()
	}
	b := j.cur
	j.cur = nil
	j.order <- b // waits while 2×GOMAXPROCS batches are in flight
	j.work <- b
}

// format writes the batch's lines.
func (b *lineBatch) format() {
	defer close(b.ready)
	for k, s := range b.samples {
		line, err := s.appendJSON(b.lines)
		if err != nil {
			b.err = fmt.Errorf("bridge: writing sample %d: %w", b.first+k, err)
			return
		}
		b.lines = append(line, '\n')
	}
}

// writeLines writes the batches in order as they are formatted; after an
// error it only drains them.
func (j *jsonlWriter) writeLines() {
	defer close(j.done)
	for b := range j.order {
		<-b.ready
		if j.werr == nil {
			if _, err := j.bw.Write(b.lines); err != nil {
				j.werr = fmt.Errorf("bridge: writing samples %d to %d: %w", b.first, b.first+len(b.samples)-1, err)
			} else if b.err != nil {
				j.werr = b.err
			}
			if j.werr != nil {
				j.failed.Store(true)
			}
		}
		clear(b.samples) // the samples are not kept past their line
		select {
		case j.free <- b:
		default:
		}
	}
}

func (j *jsonlWriter) Close() error {
	if j.closed {
		return nil
	}
	j.closed = true
	if j.work == nil { // fewer samples than a batch: formatted here
		if j.cur != nil {
			j.cur.format()
			if _, err := j.bw.Write(j.cur.lines); err != nil {
				return fmt.Errorf("bridge: writing samples: %w", err)
			}
			if j.cur.err != nil {
				return j.cur.err
			}
		}
	} else {
		if j.cur != nil && !j.failed.Load() {
			j.dispatch()
		}
		close(j.work)
		close(j.order)
		<-j.done
		j.workers.Wait()
		if j.werr != nil {
			return j.werr
		}
	}
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
