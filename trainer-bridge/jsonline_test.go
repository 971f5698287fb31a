package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// maskJSON renders response_mask as numbers ([]uint8 would marshal as base64).
type maskJSON []uint8

func (m maskJSON) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 2*len(m)+2)
	b = append(b, '[')
	for i, v := range m {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '0'+v%10)
	}
	return append(b, ']'), nil
}

// jsonRow is Row with the mask rendered as numbers: the reference that
// appendJSON must match byte for byte (it was the JSONL encoding before).
type jsonRow struct {
	rowAlias
	ResponseMask maskJSON `json:"response_mask"`
}

type rowAlias Row

func (s *Sample) jsonRow() jsonRow {
	r := s.ToRow()
	return jsonRow{rowAlias(r), maskJSON(r.ResponseMask)}
}

// refLine is the reference JSONL line of s, as encoding/json's Encoder wrote it.
func refLine(s *Sample) ([]byte, error) {
	var b bytes.Buffer
	err := json.NewEncoder(&b).Encode(s.jsonRow())
	return b.Bytes(), err
}

// checkLine compares the JSONL writer's line for s with the reference:
// same bytes, or both an error.
func checkLine(t *testing.T, s *Sample) {
	t.Helper()
	want, werr := refLine(s)
	var got bytes.Buffer
	w := NewJSONLWriter(&got)
	gerr := w.Write(s)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("error %v, encoding/json's %v", gerr, werr)
	}
	if werr != nil {
		if got.Len() != 0 {
			t.Fatalf("wrote %q before failing", got.String())
		}
		return
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("line\n%s\nencoding/json\n%s", got.Bytes(), want)
	}
}

func TestAppendJSONMatches(t *testing.T) {
	floats := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1.0 / 3, 1e-6, 9.99e-7, 1e-7, -1e-300, 1e20, 1e21, -1.5e300,
		math.MaxFloat64, math.SmallestNonzeroFloat64, math.MaxFloat32, math.SmallestNonzeroFloat32, 123456789, -2.5e-5}
	strs := []string{"", "r1", `q"uote`, `back\slash`, "<a&b>", "tab\there", "nl\n", "\x00\x1f\x7f", "é ü 中", "\u2028\u2029", "bad\xffutf8", "\b\f"}
	for i, f := range floats {
		s := &Sample{RolloutID: strs[i%len(strs)], AttemptID: strs[(i+1)%len(strs)], TaskID: strs[(i+2)%len(strs)],
			AgentName: strs[(i+3)%len(strs)], PolicyVersion: strs[(i+4)%len(strs)], GroupUID: strs[(i+5)%len(strs)],
			TokenSource: strs[(i+6)%len(strs)], ChoiceIndex: uint32(i) * 0x10000001,
			SequenceIDs: []uint64{0, math.MaxUint64}, Prompt: []uint32{0, 1, math.MaxUint32}, Response: []uint32{7},
			ResponseMask: []uint8{1, 0, 1}, Reward: f, Advantage: -f, Trimmed: i%2 == 0, Truncated: i%3 == 0, HasLogprobs: i%2 == 1}
		for _, g := range floats {
			s.Logprobs = append(s.Logprobs, float32(g), float32(-g))
		}
		checkLine(t, s)
	}
	checkLine(t, &Sample{}) // nil slices are empty arrays
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		checkLine(t, &Sample{Reward: bad})
		checkLine(t, &Sample{Advantage: bad})
		checkLine(t, &Sample{Logprobs: []float32{0, float32(bad)}})
	}
	for _, s := range strs {
		checkLine(t, &Sample{RolloutID: s, TokenSource: s})
	}
}

func FuzzAppendJSON(f *testing.F) {
	f.Add("r", "<t>", uint32(5), 0.5, math.Float32bits(-1.25), uint8(1))
	f.Add("\xff\u2028", "", uint32(0), 1e-7, uint32(0x00000001), uint8(0))
	f.Fuzz(func(t *testing.T, id, task string, tok uint32, reward float64, lpBits uint32, mask uint8) {
		checkLine(t, &Sample{RolloutID: id, TaskID: task, GroupUID: id + task, Prompt: []uint32{tok}, Response: []uint32{tok, tok},
			Logprobs: []float32{math.Float32frombits(lpBits), float32(reward)}, ResponseMask: []uint8{mask}, Reward: reward, Advantage: reward / 3})
	})
}

// TestJSONLWriterBatches checks the batched writer against the reference
// lines over several batches (and a partial last one), a sample that JSON
// cannot hold in the middle (its Write fails, the lines before it are all
// written) and a failing destination (an error, not a partial success).
func TestJSONLWriterBatches(t *testing.T) {
	samples := make([]*Sample, 5*jsonlBatch+7)
	var want bytes.Buffer
	for i := range samples {
		samples[i] = &Sample{RolloutID: fmt.Sprint("r", i), Prompt: []uint32{uint32(i), 2, 3}, Response: []uint32{uint32(i)},
			ResponseMask: []uint8{1}, Logprobs: []float32{-float32(i) / 7}, Reward: float64(i), Advantage: -float64(i) / 3}
		line, err := refLine(samples[i])
		if err != nil {
			t.Fatal(err)
		}
		want.Write(line)
	}
	var got bytes.Buffer
	if err := WriteJSONL(&got, samples); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("%d bytes, want %d (first difference at %d)", got.Len(), want.Len(), firstDiff(got.Bytes(), want.Bytes()))
	}

	bad := 3*jsonlBatch + 5
	got.Reset()
	w := NewJSONLWriter(&got)
	for i, s := range samples {
		if i == bad {
			s = &Sample{Advantage: math.NaN()}
		}
		err := w.Write(s)
		if (err != nil) != (i == bad) {
			t.Fatalf("sample %d: Write error %v", i, err)
		}
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprint("sample ", bad)) {
				t.Errorf("error %q does not name sample %d", err, bad)
			}
			break
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(got.Bytes(), []byte("\n")); n != bad || !bytes.HasPrefix(want.Bytes(), got.Bytes()) {
		t.Fatalf("after a failed Write: %d lines written, want the %d before it", n, bad)
	}

	w = NewJSONLWriter(failAfter{n: 100})
	var werr error
	for _, s := range samples {
		if werr = w.Write(s); werr != nil {
			break
		}
	}
	if cerr := w.Close(); cerr == nil || (werr != nil && !errors.Is(werr, errDisk)) || !errors.Is(cerr, errDisk) {
		t.Fatalf("failing destination: Write %v, Close %v", werr, cerr)
	}
}

var errDisk = errors.New("disk full")

// failAfter accepts n bytes, then fails.
type failAfter struct{ n int }

func (f failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		return 0, errDisk
	}
	return len(p), nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
