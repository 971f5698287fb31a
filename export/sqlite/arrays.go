package sqlite

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// appendUint32s appends ids as a JSON array: [1,2,3].
func appendUint32s(dst []byte, ids []uint32) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return append(dst, ']')
}

// appendFloat32s appends vs as a JSON array in the shortest form that reads
// back to the same float32. Non-finite values, which JSON lacks, are written
// the JSON5 way (NaN, Infinity, -Infinity): SQLite's JSON functions accept
// them and parseFloat32s reads them back.
func appendFloat32s(dst []byte, vs []float32) []byte {
	dst = append(dst, '[')
	for i, v := range vs {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch {
		case math.IsNaN(float64(v)):
			dst = append(dst, "NaN"...)
		case math.IsInf(float64(v), 1):
			dst = append(dst, "Infinity"...)
		case math.IsInf(float64(v), -1):
			dst = append(dst, "-Infinity"...)
		default:
			dst = strconv.AppendFloat(dst, float64(v), 'g', -1, 32)
		}
	}
	return append(dst, ']')
}

// arrayItems returns the comma-separated items of a JSON array of numbers.
func arrayItems(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return nil, fmt.Errorf("not a JSON array: %.40q", s)
	}
	s = strings.TrimSpace(s[1 : len(s)-1])
	if s == "" {
		return nil, nil
	}
	items := strings.Split(s, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	return items, nil
}

// parseUint32s reads a JSON array of token ids written by appendUint32s.
func parseUint32s(s string) ([]uint32, error) {
	items, err := arrayItems(s)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(items))
	for i, it := range items {
		v, err := strconv.ParseUint(it, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token id %d: %w", i, err)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// parseFloat32s reads a JSON array of numbers written by appendFloat32s.
func parseFloat32s(s string) ([]float32, error) {
	items, err := arrayItems(s)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(items))
	for i, it := range items {
		v, err := strconv.ParseFloat(it, 32)
		if err != nil {
			return nil, fmt.Errorf("value %d: %w", i, err)
		}
		out[i] = float32(v)
	}
	return out, nil
}
