package jsonscan

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzValidIndex: Index.Valid accepts exactly what gjson.Valid accepts, and
// every end it records is where SkipValue finds that container's end.
// ValidValue decides the same as Valid. (Moved from capture, where the
// index was born.)
func FuzzValidIndex(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2,{"b":"c\"]"}],"d":{}}`, ` [ ] `, `{"a":1,}`, `[1,]`, `01`, `-`, `-0.5e+3`, `1.`, `1e`,
		`"\u12G4"`, `"\x"`, "\"a\x01\"", `{"a" 1}`, `{"a":1 "b":2}`, `tru`, `nulll`, `[[[]]]`, `{"a":[}`, ``, ` `,
		`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.5}]}}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var x Index
		// On the heap (growslice): the index keys on the text's address, and
		// a short []byte(s) may live on the stack, which moves when a deep
		// recursion (gjson.Valid, ValidValue) grows it after Valid.
		b := append([]byte(nil), s...)
		got, want := x.Valid(b), gjson.Valid(s)
		if got != want {
			t.Fatalf("Valid %v, gjson.Valid %v", got, want)
		}
		// ValidValue, between whitespace, decides the same.
		i := SkipWS(b, 0)
		end, ok := ValidValue(b, i)
		if vv := ok && SkipWS(b, end) == len(b); vv != want {
			t.Fatalf("ValidValue %v (end %d), gjson.Valid %v", vv, end, want)
		}
		if ok && want && i < len(b) && (b[i] == '{' || b[i] == '[') && x.End(b, i) != end {
			t.Fatalf("ValidValue end %d, indexed end %d", end, x.End(b, i))
		}
		if !got {
			if x.Indexed() {
				t.Fatal("invalid text left indexed")
			}
			return
		}
		for i, e := range x.ends[:len(b)] {
			if e == 0 {
				continue
			}
			if b[i] != '{' && b[i] != '[' {
				t.Fatalf("end recorded at %d, %q", i, b[i])
			}
			if v := SkipValue(b, i); v != int(e) {
				t.Fatalf("container at %d: recorded end %d, SkipValue %d", i, e, v)
			}
			if x.SkipValue(b, i) != int(e) {
				t.Fatalf("container at %d: indexed SkipValue differs", i)
			}
			// A slice of the text starting at the container finds it too.
			if x.End(b[i:], 0) != int(e)-i {
				t.Fatalf("container at %d: End on a sub-slice differs", i)
			}
		}
		// A copy is not the indexed text: no lookup may answer for it.
		c := append([]byte(nil), b...)
		for i := range c {
			if x.End(c, i) != -1 {
				t.Fatalf("End answered for a copy at %d", i)
			}
		}
		x.Clear()
		if x.Indexed() {
			t.Fatal("Clear left the text indexed")
		}
	})
}

// TestWalkObject walks members and elements, with and without an index, and
// stops cleanly on malformed input.
func TestWalkObject(t *testing.T) {
	doc := []byte(` {"a" : [1, {"b":"}"} ,"x\"y"], "c":{"d":null} ,"e":true}`)
	var x Index
	if !x.Valid(doc) {
		t.Fatal("not valid")
	}
	for _, idx := range []*Index{nil, &x} {
		it := NewObjIter(doc, SkipWS(doc, 0), idx)
		var m Member
		var keys, vals []string
		for it.Next(&m) {
			keys = append(keys, string(m.Key(doc)))
			vals = append(vals, string(m.Val(doc)))
		}
		if it.Bad || it.End != len(doc) {
			t.Fatalf("index %v: bad %v end %d of %d", idx != nil, it.Bad, it.End, len(doc))
		}
		if got := fmtList(keys); got != `a|c|e` {
			t.Fatalf("keys %s", got)
		}
		if got := fmtList(vals); got != `[1, {"b":"}"} ,"x\"y"]|{"d":null}|true` {
			t.Fatalf("values %s", got)
		}
		arr := NewArrIter(doc, 8, idx)
		var elems []string
		for {
			s, e, ok := arr.Next()
			if !ok {
				break
			}
			elems = append(elems, string(doc[s:e]))
		}
		if arr.Bad || fmtList(elems) != `1|{"b":"}"}|"x\"y"` {
			t.Fatalf("elements %q bad %v", elems, arr.Bad)
		}
	}
	for _, bad := range []string{`{"a":1`, `{"a" 1}`, `{"a":1 "b":2}`, `{a:1}`, `{"a":"x}`, `{"a":`, `{"a":[1,2}`} {
		b := []byte(bad)
		it := NewObjIter(b, 0, nil)
		var m Member
		for it.Next(&m) {
		}
		if !it.Bad {
			t.Errorf("%s: not reported bad", bad)
		}
	}
	if !IsNull([]byte("null")) || IsNull([]byte("nul")) || !IsEmptyObject([]byte("{ }")) || IsEmptyObject([]byte(`{"a":1}`)) {
		t.Fatal("IsNull / IsEmptyObject")
	}
}

func fmtList(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += "|"
		}
		out += v
	}
	return out
}

// TestViews: String and Bytes share memory with their argument; Offset
// finds a substring of s's own bytes and nothing else.
func TestViews(t *testing.T) {
	b := []byte(`{"choices":[]}`)
	s := String(b)
	if s != `{"choices":[]}` || String(nil) != "" || Bytes("") != nil {
		t.Fatal("views")
	}
	b[2] = 'C'
	if s[2] != 'C' {
		t.Fatal("String copied")
	}
	if &Bytes(s)[0] != &b[0] {
		t.Fatal("Bytes copied")
	}
	if got := Offset(s, s[2:9]); got != 2 {
		t.Fatalf("Offset %d", got)
	}
	other := string(append([]byte(nil), s[2:9]...))
	if got := Offset(s, other); got != -1 {
		t.Fatalf("Offset of a copy %d", got)
	}
	if Offset(s[:3], s) != -1 || Offset(s, "") != -1 {
		t.Fatal("Offset out of range")
	}
}

// TestZeroAllocs: validating, indexing and walking allocate nothing once the
// index has its buffer, nor do the views.
func TestZeroAllocs(t *testing.T) {
	doc := []byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"a\nb"},"logprobs":{"content":[{"token":"a","logprob":-0.5,"top_logprobs":[]}]},"finish_reason":null}],"usage":null}`)
	var x Index
	x.Valid(doc)
	n := testing.AllocsPerRun(200, func() {
		if !x.Valid(doc) {
			t.Fatal("not valid")
		}
		it := NewObjIter(doc, 0, &x)
		var m Member
		for it.Next(&m) {
			if string(m.Key(doc)) == "choices" {
				a := NewArrIter(doc, m.ValStart, &x)
				for {
					if _, _, ok := a.Next(); !ok {
						break
					}
				}
			}
		}
		_ = Offset(String(doc), String(doc[3:5]))
		_ = Bytes(String(doc))
		_ = SkipValue(doc, 0)
		x.Clear()
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// BenchmarkValid: validating and indexing a vLLM chat chunk.
func BenchmarkValid(b *testing.B) {
	doc := []byte(`{"id":"chatcmpl-7dcf599b48e72fe246eb1fb3fb3ff110","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":" stream"},"logprobs":null,"finish_reason":null,"token_ids":[1234]}]}`)
	var x Index
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		if !x.Valid(doc) {
			b.Fatal("not valid")
		}
	}
}

// FuzzSkipString: SkipString agrees with a byte-by-byte reference (a
// backslash escapes the byte after it) from every quote of the input.
func FuzzSkipString(f *testing.F) {
	for _, s := range []string{`"a"`, `"abc\"def"`, `"0123456789abcde\"x"`, `"0123456789abcdef\\"`,
		`"0123456789abcde\`, `"0123456789abcdefghij\\\"k"`, `"\\\\\\\\\\\\\\\\\\"`, `"` + strings.Repeat("x", 40) + `"`} {
		f.Add([]byte(s))
	}
	ref := func(b []byte, i int) int {
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1
			}
		}
		return -1
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := range b {
			if b[i] != '"' {
				continue
			}
			if got, want := SkipString(b, i), ref(b, i); got != want {
				t.Fatalf("SkipString(%q, %d) = %d, want %d", b, i, got, want)
			}
		}
	})
}
