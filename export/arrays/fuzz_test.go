package arrays

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// refItems is the straightforward reading the fast parsers must agree with.
func refItems(s string) ([]string, bool) {
	s = strings.TrimFunc(s, func(r rune) bool { return r < 128 && isSpace(byte(r)) })
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return nil, false
	}
	s = strings.TrimFunc(s[1:len(s)-1], func(r rune) bool { return r < 128 && isSpace(byte(r)) })
	if s == "" {
		return nil, true
	}
	its := strings.Split(s, ",")
	for i := range its {
		its[i] = strings.TrimFunc(its[i], func(r rune) bool { return r < 128 && isSpace(byte(r)) })
	}
	return its, true
}

// FuzzParseUint32sReference checks ParseUint32s against strings.Split and
// strconv.ParseUint: the same ids, or an error for the same inputs.
func FuzzParseUint32sReference(f *testing.F) {
	for _, s := range []string{"[]", "[0000000000000000]", "[1,2,3]", " [ 1 , 2 ] ", "[4294967295]", "[4294967296]", "[-1]", "[+1]", "[1,,2]", "[01]", "[a]", "[", "[\t7\n]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseUint32s(s)
		its, ok := refItems(s)
		var want []uint32
		for _, it := range its {
			if it == "" || it[0] == '+' { // ParseUint takes neither "" nor a sign; neither do we
				ok = false
				break
			}
			v, perr := strconv.ParseUint(it, 10, 32)
			if perr != nil {
				ok = false
				break
			}
			want = append(want, uint32(v))
		}
		if ok != (err == nil) {
			t.Fatalf("ParseUint32s(%q) error %v, reference ok=%v", s, err, ok)
		}
		if ok && !slices.Equal(got, want) {
			t.Fatalf("ParseUint32s(%q) = %v, want %v", s, got, want)
		}
	})
}

// FuzzFloat32sRoundTrip writes float32 bit patterns with AppendFloat32s and
// in ClickHouse's form (inf, -inf, nan) and reads them back bit for bit
// (any NaN for a NaN).
func FuzzFloat32sRoundTrip(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0})
	f.Add(binary.LittleEndian.AppendUint32(nil, math.Float32bits(-0.1234567)))
	f.Add(binary.LittleEndian.AppendUint32(nil, 1)) // smallest subnormal
	f.Add(binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(math.Inf(-1)))))
	f.Fuzz(func(t *testing.T, b []byte) {
		vs := make([]float32, len(b)/4)
		for i := range vs {
			vs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		ch := make([]string, len(vs))
		for i, v := range vs {
			switch {
			case v != v:
				ch[i] = "nan"
			case math.IsInf(float64(v), 1):
				ch[i] = "inf"
			case math.IsInf(float64(v), -1):
				ch[i] = "-inf"
			default:
				ch[i] = strconv.FormatFloat(float64(v), 'g', -1, 32)
			}
		}
		for _, s := range []string{string(AppendFloat32s(nil, vs)), "[" + strings.Join(ch, ",") + "]"} {
			got, err := ParseFloat32s(s)
			if err != nil || len(got) != len(vs) {
				t.Fatalf("ParseFloat32s(%q) = %v, %v", s, got, err)
			}
			for i := range vs {
				if math.Float32bits(got[i]) != math.Float32bits(vs[i]) && !(vs[i] != vs[i] && got[i] != got[i]) {
					t.Fatalf("ParseFloat32s(%q)[%d] = %v, want %v", s, i, got[i], vs[i])
				}
			}
		}
	})
}
