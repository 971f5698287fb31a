package arrays

import (
	"math"
	"strconv"
	"testing"
)

func TestArrays(t *testing.T) {
	f := func(ids []uint32, vs []float32, wantIDs, wantVs string) {
		t.Helper()
		if got := string(AppendUint32s(nil, ids)); got != wantIDs {
			t.Fatalf("AppendUint32s(%v) = %s, want %s", ids, got, wantIDs)
		}
		if got := string(AppendFloat32s(nil, vs)); got != wantVs {
			t.Fatalf("AppendFloat32s(%v) = %s, want %s", vs, got, wantVs)
		}
		backIDs, err := ParseUint32s(wantIDs)
		if err != nil || len(backIDs) != len(ids) {
			t.Fatalf("ParseUint32s(%s) = %v, %v", wantIDs, backIDs, err)
		}
		for i := range ids {
			if backIDs[i] != ids[i] {
				t.Fatalf("ParseUint32s(%s)[%d] = %d", wantIDs, i, backIDs[i])
			}
		}
		backVs, err := ParseFloat32s(wantVs)
		if err != nil || len(backVs) != len(vs) {
			t.Fatalf("ParseFloat32s(%s) = %v, %v", wantVs, backVs, err)
		}
		for i := range vs {
			if math.Float32bits(backVs[i]) != math.Float32bits(vs[i]) && !(vs[i] != vs[i] && backVs[i] != backVs[i]) {
				t.Fatalf("ParseFloat32s(%s)[%d] = %v, want %v", wantVs, i, backVs[i], vs[i])
			}
		}
	}
	f(nil, nil, "[]", "[]")
	f([]uint32{0}, []float32{0}, "[0]", "[0]")
	f([]uint32{1, 2, 3}, []float32{-0.5, -1.25, 1e-7}, "[1,2,3]", "[-0.5,-1.25,1e-07]")
	f([]uint32{math.MaxUint32}, []float32{float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.NaN()), math.MaxFloat32, math.SmallestNonzeroFloat32},
		"[4294967295]", "[-Infinity,Infinity,NaN,3.4028235e+38,1e-45]")
}

func TestParseArraysRejects(t *testing.T) {
	for _, s := range []string{"", "[", "1,2", "[1,,2]", "[-1]", "[4294967296]", "[a]", "{}"} {
		if _, err := ParseUint32s(s); err == nil {
			t.Errorf("ParseUint32s(%q): no error", s)
		}
	}
	for _, s := range []string{"", "[", "[1,,2]", "[x]", "[1e99]"} {
		if _, err := ParseFloat32s(s); err == nil {
			t.Errorf("ParseFloat32s(%q): no error", s)
		}
	}
	// Whitespace as other JSON writers put it is accepted.
	if v, err := ParseUint32s(" [ 1 , 2 ] "); err != nil || len(v) != 2 || v[1] != 2 {
		t.Errorf("ParseUint32s with spaces = %v, %v", v, err)
	}
}

func FuzzParseUint32s(f *testing.F) {
	for _, s := range []string{"[]", "[1,2,3]", "[4294967295]", " [ 1 ] ", "[-1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ParseUint32s(s)
		if err != nil {
			return
		}
		// What parses re-encodes and parses to the same ids.
		again, err := ParseUint32s(string(AppendUint32s(nil, ids)))
		if err != nil || len(again) != len(ids) {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
		for i := range ids {
			if again[i] != ids[i] {
				t.Fatalf("round trip of %q: %v != %v", s, again, ids)
			}
		}
	})
}

func FuzzParseFloat32s(f *testing.F) {
	for _, s := range []string{"[]", "[-0.5,1e-07]", "[-Infinity,NaN]", "[3.4028235e+38]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		vs, err := ParseFloat32s(s)
		if err != nil {
			return
		}
		again, err := ParseFloat32s(string(AppendFloat32s(nil, vs)))
		if err != nil || len(again) != len(vs) {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
		for i := range vs {
			if math.Float32bits(again[i]) != math.Float32bits(vs[i]) && !(vs[i] != vs[i] && again[i] != again[i]) {
				t.Fatalf("round trip of %q: %v != %v", s, again, vs)
			}
		}
	})
}

func BenchmarkAppendArrays(b *testing.B) {
	ids := make([]uint32, 4096)
	vs := make([]float32, 4096)
	for i := range ids {
		ids[i] = uint32(i * 37)
		vs[i] = -float32(i) / 97
	}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendUint32s(buf[:0], ids)
		buf = AppendFloat32s(buf[:0], vs)
	}
}

// TestAppendUintsMatchesStrconv: AppendUint32s and AppendUint64s write
// strconv's digits for every digit count and at the edges of the types.
func TestAppendUintsMatchesStrconv(t *testing.T) {
	var vs64 []uint64
	for p := uint64(1); p < 1e19; p *= 10 {
		vs64 = append(vs64, p-1, p, p+1, p*7+3)
	}
	vs64 = append(vs64, math.MaxUint64, math.MaxUint32, 0)
	var vs32 []uint32
	want32, want64 := []byte("["), []byte("[")
	for i, v := range vs64 {
		if i > 0 {
			want64 = append(want64, ',')
		}
		want64 = strconv.AppendUint(want64, v, 10)
		if v <= math.MaxUint32 {
			if len(vs32) > 0 {
				want32 = append(want32, ',')
			}
			vs32 = append(vs32, uint32(v))
			want32 = strconv.AppendUint(want32, v, 10)
		}
	}
	want32, want64 = append(want32, ']'), append(want64, ']')
	if got := AppendUint64s([]byte("x"), vs64); string(got) != "x"+string(want64) {
		t.Fatalf("AppendUint64s = %s, want x%s", got, want64)
	}
	if got := AppendUint32s(nil, vs32); string(got) != string(want32) {
		t.Fatalf("AppendUint32s = %s, want %s", got, want32)
	}
	if got := AppendUint32s(nil, nil); string(got) != "[]" {
		t.Fatalf("AppendUint32s(nil) = %s", got)
	}
}

// BenchmarkAppendUint32s: token ids as a tokenizer's vocabulary spreads them
// (1 to 6 digits), strconv.AppendUint per id against AppendUint32s.
func BenchmarkAppendUint32s(b *testing.B) {
	ids := make([]uint32, 640)
	for i := range ids {
		ids[i] = uint32(i*7919) % 152000
	}
	buf := make([]byte, 0, 8192)
	b.Run("strconv", func(b *testing.B) {
		for b.Loop() {
			buf = appendUints(buf[:0], ids)
		}
	})
	b.Run("table", func(b *testing.B) {
		for b.Loop() {
			buf = AppendUint32s(buf[:0], ids)
		}
	})
}

// FuzzAppendUint32s: AppendUint32s writes what strconv.AppendUint does, id
// by id, after whatever dst held.
func FuzzAppendUint32s(f *testing.F) {
	f.Add([]byte{}, uint32(0), uint32(9), uint32(10), uint32(9999), uint32(10000))
	f.Add([]byte("x"), uint32(99999999), uint32(1e8), uint32(math.MaxUint32), uint32(151643), uint32(100))
	f.Fuzz(func(t *testing.T, dst []byte, a, b, c, d, e uint32) {
		ids := []uint32{a, b, c, d, e, a % 10, b % 100, c % 1000, d % 10000, e % 100000, a % 1e6, b % 1e7}
		for n := range len(ids) + 1 {
			want := append(append([]byte(nil), dst...), '[')
			for i, v := range ids[:n] {
				if i > 0 {
					want = append(want, ',')
				}
				want = strconv.AppendUint(want, uint64(v), 10)
			}
			want = append(want, ']')
			if got := AppendUint32s(append([]byte(nil), dst...), ids[:n]); string(got) != string(want) {
				t.Fatalf("AppendUint32s(%v) = %s, want %s", ids[:n], got, want)
			}
		}
	})
}

// TestAppendUint32sEvery: every id below 10^6 and around each power of ten
// is written as strconv writes it.
func TestAppendUint32sEvery(t *testing.T) {
	ids := make([]uint32, 0, 1e6+100)
	for v := range uint32(1e6) {
		ids = append(ids, v)
	}
	for p := uint64(10); p <= math.MaxUint32; p *= 10 {
		for d := uint64(0); d < 3; d++ {
			ids = append(ids, uint32(p-1-d), uint32(p+d))
		}
	}
	ids = append(ids, math.MaxUint32, math.MaxUint32-1)
	if got, want := AppendUint32s(nil, ids), appendUints(nil, ids); string(got) != string(want) {
		t.Fatal("AppendUint32s differs from strconv.AppendUint")
	}
}
