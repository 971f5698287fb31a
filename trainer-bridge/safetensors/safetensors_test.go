package safetensors

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestGoldenBytes checks the exact bytes of a tiny file:
// header {"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}} is 54 bytes,
// padded with two spaces to 56; then 1 and -2 as little-endian int32.
func TestGoldenBytes(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, []Tensor{{Name: "a", Shape: []int{2}, I32: []int32{1, -2}}}, nil); err != nil {
		t.Fatal(err)
	}
	header := `{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}` + "  "
	want := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	want = append(want, header...)
	want = append(want, 1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff)
	if len(header) != 56 || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("got %q\nwant %q", buf.Bytes(), want)
	}
}

func TestRoundTrip(t *testing.T) {
	in := []Tensor{
		{Name: "input_ids", Shape: []int{2, 3}, I64: []int64{0, 5, 6, 7, 8, 1 << 40}},
		{Name: "adv", Shape: []int{2, 1}, F32: []float32{-0.5, 1.25}},
		{Name: "m", Shape: []int{3}, I32: []int32{1, 0, 1}},
		{Name: "empty", Shape: []int{0, 4}, F32: []float32{}},
	}
	var buf bytes.Buffer
	if err := Write(&buf, in, map[string]string{"uid": `["t1","t2"]`}); err != nil {
		t.Fatal(err)
	}
	if hl := binary.LittleEndian.Uint64(buf.Bytes()); hl%8 != 0 {
		t.Fatalf("header length %d not padded to 8", hl)
	}
	out, meta, err := Read(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if meta["uid"] != `["t1","t2"]` || len(out) != 4 {
		t.Fatalf("meta %v, %d tensors", meta, len(out))
	}
	if out[0].Name != "input_ids" || out[0].I64[5] != 1<<40 || out[1].F32[0] != -0.5 || out[2].I32[1] != 0 || out[3].Name != "empty" || len(out[3].F32) != 0 {
		t.Fatalf("round trip: %+v", out)
	}
}

func TestWriteErrors(t *testing.T) {
	for name, ts := range map[string][]Tensor{
		"shape": {{Name: "a", Shape: []int{3}, I32: []int32{1}}},
		"dup":   {{Name: "a", Shape: []int{1}, I32: []int32{1}}, {Name: "a", Shape: []int{1}, I32: []int32{1}}},
		"name":  {{Name: "__metadata__", Shape: []int{1}, I32: []int32{1}}},
		"neg":   {{Name: "a", Shape: []int{-1}, I32: []int32{}}},
	} {
		if err := Write(&bytes.Buffer{}, ts, nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestReadErrors(t *testing.T) {
	good := func() []byte {
		var buf bytes.Buffer
		Write(&buf, []Tensor{{Name: "a", Shape: []int{2}, I32: []int32{1, 2}}}, nil)
		return buf.Bytes()
	}
	cases := map[string][]byte{
		"short":    {1, 2},
		"trailing": append(good(), 0),
		"cut":      good()[:len(good())-1],
		"hugehdr":  binary.LittleEndian.AppendUint64(nil, 1<<40),
	}
	for name, data := range cases {
		if _, _, err := Read(data); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	Write(&buf, []Tensor{{Name: "a", Shape: []int{2}, I64: []int64{1, 2}}, {Name: "b", Shape: []int{1}, F32: []float32{3}}}, map[string]string{"k": "v"})
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, meta, err := Read(data)
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := Write(&out, ts, meta); err != nil {
			t.Fatalf("re-write of a parsed file: %v", err)
		}
		if _, _, err := Read(out.Bytes()); err != nil {
			t.Fatalf("re-read: %v", err)
		}
	})
}
