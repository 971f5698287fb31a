// Package arrays writes and reads the text form of the token-id and logprob
// arrays the stores keep: "[1,2,3]" and "[-0.5,-1.25]". The embedded store
// keeps its array columns in this form (SQLite has no array type), and the
// trainer bridge reads ClickHouse's arrays in it (toString(col)), which is
// several times faster than scanning them element by element through the
// driver's reflection.
package arrays

import (
	"fmt"
	"math"
	"slices"
	"strconv"
)

// AppendUint32s appends ids as a JSON array: [1,2,3]. The digits are
// strconv's, four at a time from a table (token ids are mostly below 10^8:
// one division each), which halves the cost of strconv.AppendUint per id.
func AppendUint32s(dst []byte, ids []uint32) []byte {
	dst = slices.Grow(dst, 2+11*len(ids))
	dst = append(dst, '[')
	for i, v := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch {
		case v < 10000:
			dst = appendUpTo4(dst, v)
		case v < 1e8:
			hi, lo := v/10000, v%10000
			dst = appendUpTo4(dst, hi)
			t := digits4[lo*4 : lo*4+4 : lo*4+4]
			dst = append(dst, t[0], t[1], t[2], t[3])
		default:
			dst = strconv.AppendUint(dst, uint64(v), 10)
		}
	}
	return append(dst, ']')
}

// digits4 holds "0000" to "9999", four bytes each.
var digits4 = func() (t [40000]byte) {
	for i := range 10000 {
		t[4*i], t[4*i+1], t[4*i+2], t[4*i+3] = byte('0'+i/1000), byte('0'+i/100%10), byte('0'+i/10%10), byte('0'+i%10)
	}
	return t
}()

// appendUpTo4 appends v < 10000 without leading zeros.
func appendUpTo4(dst []byte, v uint32) []byte {
	t := digits4[v*4 : v*4+4 : v*4+4]
	switch {
	case v < 10:
		return append(dst, t[3])
	case v < 100:
		return append(dst, t[2], t[3])
	case v < 1000:
		return append(dst, t[1], t[2], t[3])
	}
	return append(dst, t[0], t[1], t[2], t[3])
}

// AppendUint64s appends vs as a JSON array: [1,2,3].
func AppendUint64s(dst []byte, vs []uint64) []byte { return appendUints(dst, vs) }

func appendUints[T uint32 | uint64](dst []byte, vs []T) []byte {
	dst = append(dst, '[')
	for i, v := range vs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(v), 10)
	}
	return append(dst, ']')
}

// AppendFloat32s appends vs as a JSON array in the shortest form that reads
// back to the same float32. Non-finite values, which JSON lacks, are written
// the JSON5 way (NaN, Infinity, -Infinity): SQLite's JSON functions accept
// them and ParseFloat32s reads them back.
func AppendFloat32s(dst []byte, vs []float32) []byte {
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

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// items calls f with each comma-separated item of the array s (trimmed of
// white space) and its index; it returns the number of items.
func items(s string, f func(i int, item string) error) (int, error) {
	lo, hi := 0, len(s)
	for lo < hi && isSpace(s[lo]) {
		lo++
	}
	for hi > lo && isSpace(s[hi-1]) {
		hi--
	}
	if hi-lo < 2 || s[lo] != '[' || s[hi-1] != ']' {
		return 0, fmt.Errorf("not an array of numbers like [1,2]: %.40q", s)
	}
	lo, hi = lo+1, hi-1
	for lo < hi && isSpace(s[lo]) {
		lo++
	}
	if lo == hi {
		return 0, nil
	}
	n := 0
	for {
		end := lo
		for end < hi && s[end] != ',' {
			end++
		}
		a, b := lo, end
		for a < b && isSpace(s[a]) {
			a++
		}
		for b > a && isSpace(s[b-1]) {
			b--
		}
		if err := f(n, s[a:b]); err != nil {
			return n, err
		}
		n++
		if end == hi {
			return n, nil
		}
		lo = end + 1
	}
}

// count returns how many items the array s has at most (its commas + 1,
// 0 for a string too short to hold any).
func count(s string) int {
	if len(s) < 3 {
		return 0
	}
	n := 1
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			n++
		}
	}
	return n
}

// ParseUint32s reads an array of token ids such as AppendUint32s writes, or
// ClickHouse's toString of an Array(UInt32). White space around items is
// accepted; anything else that is not a decimal uint32 is an error.
func ParseUint32s(s string) ([]uint32, error) {
	out := make([]uint32, 0, count(s))
	_, err := items(s, func(i int, it string) error {
		if it == "" {
			return fmt.Errorf("token id %d is empty", i)
		}
		var v uint64
		for j := 0; j < len(it); j++ {
			c := it[j]
			if c < '0' || c > '9' {
				return fmt.Errorf("token id %d: %q is not a uint32", i, it)
			}
			if v = v*10 + uint64(c-'0'); v > math.MaxUint32 {
				return fmt.Errorf("token id %d: %.40q is out of the uint32 range", i, it)
			}
		}
		out = append(out, uint32(v))
		return nil
	})
	return out, err
}

// ParseFloat32s reads an array of numbers such as AppendFloat32s writes, or
// ClickHouse's toString of an Array(Float32) (shortest round-trip form; inf,
// -inf and nan for non-finite values). Every finite value reads back to the
// same float32 bits it was written from.
func ParseFloat32s(s string) ([]float32, error) {
	out := make([]float32, 0, count(s))
	_, err := items(s, func(i int, it string) error {
		v, err := strconv.ParseFloat(it, 32)
		if err != nil {
			return fmt.Errorf("value %d: %w", i, err)
		}
		out = append(out, float32(v))
		return nil
	})
	return out, err
}
