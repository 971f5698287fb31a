// Package safetensors writes and reads the safetensors format: an 8-byte
// little-endian header length, a JSON header (padded with spaces to a
// multiple of 8 bytes) mapping each tensor name to its dtype, shape and
// [begin, end) byte offsets in the data section, then the raw little-endian
// data. Optional string metadata sits under "__metadata__".
package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// Tensor is one named tensor. Exactly one of the data slices is set and its
// length equals the product of Shape.
type Tensor struct {
	Name  string
	Shape []int
	I64   []int64
	I32   []int32
	F32   []float32
}

// DType is the safetensors dtype name of t ("I64", "I32", "F32").
func (t *Tensor) DType() string {
	switch {
	case t.I64 != nil:
		return "I64"
	case t.I32 != nil:
		return "I32"
	default:
		return "F32"
	}
}

func (t *Tensor) elems() int {
	switch {
	case t.I64 != nil:
		return len(t.I64)
	case t.I32 != nil:
		return len(t.I32)
	default:
		return len(t.F32)
	}
}

func (t *Tensor) size() int {
	if t.I64 != nil {
		return 8 * len(t.I64)
	}
	return 4 * t.elems()
}

type entry struct {
	DType       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	DataOffsets [2]int `json:"data_offsets"`
}

// Write writes tensors (in the order given) and metadata to w.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	off := 0
	for i := range tensors {
		t := &tensors[i]
		n := 1
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: %s: negative dimension in %v", t.Name, t.Shape)
			}
			n *= d
		}
		if t.Name == "" || t.Name == "__metadata__" {
			return fmt.Errorf("safetensors: tensor %d: bad name %q", i, t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("safetensors: duplicate tensor %q", t.Name)
		}
		if n != t.elems() {
			return fmt.Errorf("safetensors: %s: shape %v needs %d elements, have %d", t.Name, t.Shape, n, t.elems())
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = entry{DType: t.DType(), Shape: shape, DataOffsets: [2]int{off, off + t.size()}}
		off += t.size()
	}
	hj, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("safetensors: header: %w", err)
	}
	for len(hj)%8 != 0 {
		hj = append(hj, ' ')
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hj)))
	bw.Write(lenBuf[:])
	bw.Write(hj)
	var b [8]byte
	for i := range tensors {
		t := &tensors[i]
		switch {
		case t.I64 != nil:
			for _, v := range t.I64 {
				binary.LittleEndian.PutUint64(b[:], uint64(v))
				bw.Write(b[:8])
			}
		case t.I32 != nil:
			for _, v := range t.I32 {
				binary.LittleEndian.PutUint32(b[:], uint32(v))
				bw.Write(b[:4])
			}
		default:
			for _, v := range t.F32 {
				binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
				bw.Write(b[:4])
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	return nil
}

// maxHeader bounds the header a reader accepts (100 MB, as the reference implementation).
const maxHeader = 100 << 20

// Read parses a whole safetensors file held in data. Tensors come back in
// data-offset order; I64, I32 and F32 are supported.
func Read(data []byte) ([]Tensor, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, errors.New("safetensors: file shorter than 8 bytes")
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > maxHeader || n > uint64(len(data)-8) {
		return nil, nil, fmt.Errorf("safetensors: header length %d out of range", n)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		return nil, nil, fmt.Errorf("safetensors: header: %w", err)
	}
	body := data[8+n:]
	var meta map[string]string
	var out []Tensor
	var entries []entry
	for name, r := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(r, &meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors: metadata: %w", err)
			}
			continue
		}
		if name == "" {
			return nil, nil, errors.New("safetensors: a tensor has an empty name")
		}
		var e entry
		if err := json.Unmarshal(r, &e); err != nil {
			return nil, nil, fmt.Errorf("safetensors: %s: %w", name, err)
		}
		out = append(out, Tensor{Name: name, Shape: e.Shape})
		entries = append(entries, e)
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return entries[idx[a]].DataOffsets[0] < entries[idx[b]].DataOffsets[0] })
	pos := 0
	sorted := make([]Tensor, 0, len(out))
	for _, i := range idx {
		e, t := entries[i], out[i]
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin != pos || end < begin || end > len(body) {
			return nil, nil, fmt.Errorf("safetensors: %s: offsets %v not contiguous within %d bytes", t.Name, e.DataOffsets, len(body))
		}
		pos = end
		elems := 1
		for _, d := range e.Shape {
			if d < 0 || d > 0 && elems > len(body)/d+1 {
				return nil, nil, fmt.Errorf("safetensors: %s: bad shape %v", t.Name, e.Shape)
			}
			elems *= d
		}
		b := body[begin:end]
		width := 4
		if e.DType == "I64" {
			width = 8
		}
		if len(b) != elems*width {
			return nil, nil, fmt.Errorf("safetensors: %s: %d bytes for %d elements of %s", t.Name, len(b), elems, e.DType)
		}
		switch e.DType {
		case "I64":
			t.I64 = make([]int64, elems)
			for k := range t.I64 {
				t.I64[k] = int64(binary.LittleEndian.Uint64(b[8*k:]))
			}
		case "I32":
			t.I32 = make([]int32, elems)
			for k := range t.I32 {
				t.I32[k] = int32(binary.LittleEndian.Uint32(b[4*k:]))
			}
		case "F32":
			t.F32 = make([]float32, elems)
			for k := range t.F32 {
				t.F32[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:]))
			}
		default:
			return nil, nil, fmt.Errorf("safetensors: %s: unsupported dtype %q", t.Name, e.DType)
		}
		sorted = append(sorted, t)
	}
	if pos != len(body) {
		return nil, nil, fmt.Errorf("safetensors: %d trailing bytes after the last tensor", len(body)-pos)
	}
	return sorted, meta, nil
}
