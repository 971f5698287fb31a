package bridge

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
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

// TestSpillSharedPrefix: turns whose prompt continues the previous turn's
// prompt and response are stored once and read back whole, as are prompts
// that diverge, shrink or start over.
func TestSpillSharedPrefix(t *testing.T) {
	sp, err := newSpill(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	ids := func(from, n int) []uint32 {
		v := make([]uint32, n)
		for i := range v {
			v[i] = uint32(from + i)
		}
		return v
	}
	turn1 := &Sample{Prompt: ids(0, 400), Response: ids(1000, 50)}
	turn2 := &Sample{Prompt: append(append(ids(0, 400), ids(1000, 50)...), ids(2000, 10)...), Response: ids(3000, 5)}
	diverged := &Sample{Prompt: append(ids(0, 100), 7), Response: ids(1, 1)}
	shorter := &Sample{Prompt: ids(0, 50), Response: []uint32{}}
	other := &Sample{Prompt: ids(9, 3), Response: []uint32{}}
	want := []*Sample{turn1, turn2, diverged, shorter, other, turn1}
	raw := 0
	for _, s := range want {
		s.SequenceIDs, s.ResponseMask, s.Logprobs = []uint64{}, []uint8{}, []float32{}
		if err := sp.write(s); err != nil {
			t.Fatal(err)
		}
		raw += 4 * (len(s.Prompt) + len(s.Response))
	}
	// Ids written: turn1 450, turn2 15, diverged 2, shorter 0, other 3,
	// turn1 again 450 (its prefix with other's is empty).
	if ids := 4 * (450 + 15 + 2 + 0 + 3 + 450); sp.n > int64(ids+200) || sp.n < int64(ids) {
		t.Fatalf("spill holds %d bytes for %d bytes of ids (%d without sharing)", sp.n, ids, raw)
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
			t.Fatalf("sample %d: prompt %v response %v, want %v %v", i, got.Prompt, got.Response, w.Prompt, w.Response)
		}
	}
}

// TestSpillReadAhead: the decoding goroutine hands out every sample in
// order across batches, reports what it cannot read, and stops when told
// to, also mid-spill.
func TestSpillReadAhead(t *testing.T) {
	sp, err := newSpill(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	const n = 200
	for i := range n {
		if err := sp.write(&Sample{RolloutID: strconv.Itoa(i), Prompt: []uint32{uint32(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.rewind(); err != nil {
		t.Fatal(err)
	}
	r := sp.readAhead(n)
	for i := range n {
		x, err := r.sample()
		if err != nil || x.RolloutID != strconv.Itoa(i) || x.Prompt[0] != uint32(i) {
			t.Fatalf("sample %d: %+v, %v", i, x, err)
		}
	}
	if x, err := r.sample(); err == nil {
		t.Fatalf("sample past the count: %+v", x)
	}
	r.stop()

	// Asked for more than the spill holds: the read error comes out.
	if err := sp.rewind(); err != nil {
		t.Fatal(err)
	}
	r = sp.readAhead(n + 1)
	for i := range n {
		if _, err := r.sample(); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
	}
	if _, err := r.sample(); err == nil || !strings.Contains(err.Error(), "reading the sample spill") {
		t.Fatalf("read past the end: %v", err)
	}
	r.stop()

	// Stopped after one sample, with the goroutine blocked on a full channel.
	if err := sp.rewind(); err != nil {
		t.Fatal(err)
	}
	r = sp.readAhead(n)
	if _, err := r.sample(); err != nil {
		t.Fatal(err)
	}
	r.stop()
}
