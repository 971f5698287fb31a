package bridge

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"reflect"
	"testing"
)

// TestSpillRoundTrip: every field of a sample reads back as written, in
// order, and the file is gone after close.
func TestSpillRoundTrip(t *testing.T) {
	sp, err := newSpill(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := []*Sample{
		{RolloutID: "r1", AttemptID: "a", TaskID: "t", AgentName: "ag", PolicyVersion: "v7", ChoiceIndex: 3, SequenceIDs: []uint64{1, 1 << 40},
			Prompt: []uint32{0, math.MaxUint32}, Response: []uint32{5}, ResponseMask: []uint8{1}, Logprobs: []float32{float32(math.Inf(-1))},
			Reward: -0.25, Advantage: math.SmallestNonzeroFloat64, GroupUID: "g", Trimmed: true, HasLogprobs: true, TokenSource: "engine"},
		{RolloutID: "r2", SequenceIDs: []uint64{}, Prompt: []uint32{}, Response: []uint32{}, ResponseMask: []uint8{}, Logprobs: []float32{}, Truncated: true},
	}
	for _, s := range want {
		if err := sp.write(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.rewind(); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		got, err := sp.read()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("sample %d: got %+v, want %+v", i, got, w)
		}
	}
	if _, err := sp.read(); err == nil {
		t.Fatal("read past the end: no error")
	}
	name := sp.f.Name()
	sp.close()
	if _, err := os.Stat(name); !os.IsNotExist(err) {
		t.Fatalf("spill file left behind: %v", err)
	}
}

// TestSpillDecoderBounded: a truncated or inflated record is an error, never
// a panic or a huge allocation.
func TestSpillDecoderBounded(t *testing.T) {
	sp, err := newSpill(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	if err := sp.write(&Sample{RolloutID: "r", Prompt: []uint32{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	rec := append([]byte(nil), sp.buf...)
	for cut := 0; cut < len(rec); cut++ {
		sp.r = bufio.NewReader(bytes.NewReader(append(binary.AppendUvarint(nil, uint64(cut)), rec[:cut]...)))
		if x, err := sp.read(); err == nil {
			t.Fatalf("record cut to %d of %d bytes read as %+v", cut, len(rec), x)
		}
	}
	sp.r = bufio.NewReader(bytes.NewReader(append(binary.AppendUvarint(nil, uint64(len(rec))), rec...)))
	if x, err := sp.read(); err != nil || x.RolloutID != "r" || len(x.Prompt) != 3 {
		t.Fatalf("whole record: %+v, %v", x, err)
	}
	d := spillDecoder{b: []byte{0xff, 0xff, 0xff, 0xff, 0x0f}} // a count of 4 Gi items in 5 bytes
	if n := d.count(4); n != 0 || !d.bad {
		t.Fatalf("inflated count = %d, bad = %v", n, d.bad)
	}
}
