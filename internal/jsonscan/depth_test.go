package jsonscan

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// refValidate is the reference FuzzDepthMatchesReference checks Validate
// against: a plain recursive descent that counts depth as encoding/json
// does, written for clarity, not speed (the validator before it was made
// iterative, with a counter added). Fuzz inputs are small, so recursion is
// safe here.
func refValidate(b []byte) error {
	i := SkipWS(b, 0)
	if i >= len(b) {
		return ErrInvalid
	}
	i, err := refAny(b, i, 0)
	if err != nil {
		return err
	}
	if SkipWS(b, i) != len(b) {
		return ErrInvalid
	}
	return nil
}

func refAny(b []byte, i, depth int) (int, error) {
	if b[i] == '{' || b[i] == '[' {
		return refContainer(b, i, depth+1)
	}
	i, ok := vScalar(b, i)
	if !ok {
		return i, ErrInvalid
	}
	return i, nil
}

func refContainer(b []byte, open, depth int) (int, error) {
	if depth > MaxDepth {
		return open, ErrTooDeep
	}
	obj, closer := b[open] == '{', byte(']')
	if obj {
		closer = '}'
	}
	i := SkipWS(b, open+1)
	if i < len(b) && b[i] == closer {
		return i + 1, nil
	}
	for {
		if obj {
			if i >= len(b) || b[i] != '"' {
				return i, ErrInvalid
			}
			var ok bool
			if i, ok = vString(b, i+1); !ok {
				return i, ErrInvalid
			}
			if i = SkipWS(b, i); i >= len(b) || b[i] != ':' {
				return i, ErrInvalid
			}
			i = SkipWS(b, i+1)
		}
		if i >= len(b) {
			return i, ErrInvalid
		}
		var err error
		if i, err = refAny(b, i, depth); err != nil {
			return i, err
		}
		switch i = SkipWS(b, i); {
		case i >= len(b):
			return i, ErrInvalid
		case b[i] == closer:
			return i + 1, nil
		case b[i] == ',':
			i = SkipWS(b, i+1)
		default:
			return i, ErrInvalid
		}
	}
}

// FuzzDepthMatchesReference: Validate (and Index.Validate, ValidValue) give
// the reference's verdict (valid, too deep, invalid: whichever comes first)
// on any text, wrapped in up to MaxDepth+8 levels of arrays or objects so
// that the limit is crossed at every kind of place; a text within the limit
// is valid exactly when gjson.Valid says so.
func FuzzDepthMatchesReference(f *testing.F) {
	for _, s := range []string{`1`, `[]`, `{"a":[{"b":[]}]}`, `[[[`, `]`, `{"a":1,}`, `"[[["`, `[1,[2,[3]]]`, `{"a" [`, ` `} {
		f.Add(s, uint16(0), false)
		f.Add(s, uint16(MaxDepth-1), false)
		f.Add(s, uint16(MaxDepth), true)
		f.Add(s, uint16(MaxDepth+1), false)
	}
	f.Fuzz(func(t *testing.T, s string, wrap uint16, objects bool) {
		n := int(wrap) % (MaxDepth + 8)
		open, close := "[", "]"
		if objects {
			open, close = `{"k":`, "}"
		}
		b := []byte(strings.Repeat(open, n) + s + strings.Repeat(close, n))
		want := refValidate(b)
		if err := Validate(b); err != want {
			t.Fatalf("Validate: %v, reference: %v", err, want)
		}
		var x Index
		if err := x.Validate(b); err != want {
			t.Fatalf("Index.Validate: %v, reference: %v", err, want)
		}
		if x.Indexed() != (want == nil) {
			t.Fatalf("indexed %v after verdict %v", x.Indexed(), want)
		}
		i := SkipWS(b, 0)
		end, ok := ValidValue(b, i)
		if vv := ok && SkipWS(b, end) == len(b); vv != (want == nil) {
			t.Fatalf("ValidValue %v (end %d), reference %v", vv, end, want)
		}
		if want != ErrTooDeep {
			if g := gjson.ValidBytes(b); g != (want == nil) {
				t.Fatalf("gjson.Valid %v, reference %v", g, want)
			}
		}
	})
}

// TestDepthLimit pins the limit: MaxDepth levels pass, one more does not,
// however the levels are spelled, and a text of millions of openings is
// refused at once without growing the stack (the drill of issue 36 crashed
// gjson.Valid with 5 to 10 million '[').
func TestDepthLimit(t *testing.T) {
	f := func(name string, b []byte, want error) {
		t.Helper()
		if err := Validate(b); !errors.Is(err, want) {
			t.Fatalf("%s: Validate = %v, want %v", name, err, want)
		}
		var x Index
		if err := x.Validate(b); !errors.Is(err, want) {
			t.Fatalf("%s: Index.Validate = %v, want %v", name, err, want)
		}
	}
	nest := func(n int, open, close, inner string) []byte {
		return []byte(strings.Repeat(open, n) + inner + strings.Repeat(close, n))
	}
	f("arrays at the limit", nest(MaxDepth, "[", "]", ""), nil)
	f("arrays over the limit", nest(MaxDepth+1, "[", "]", ""), ErrTooDeep)
	f("objects at the limit", nest(MaxDepth, `{"a":`, "}", "1"), nil)
	f("objects over the limit", nest(MaxDepth, `{"a":`, "}", "{}"), ErrTooDeep)
	f("mixed, spaced", nest(MaxDepth/2, ` [ {"k" : `, " } ] ", "[]"), ErrTooDeep)
	f("mixed at the limit", nest(MaxDepth/2, `[{"k":`, "}]", "0"), nil)
	f("brackets in strings do not count", []byte(`["`+strings.Repeat("[", 10*MaxDepth)+`"]`), nil)
	f("siblings do not add up", []byte("["+strings.Repeat("[[]],", 4*MaxDepth)+"[]]"), nil)
	f("invalid before the limit", []byte(`[1 `+strings.Repeat("[", MaxDepth)), ErrInvalid)
	f("unterminated, too deep", []byte(`{"model":"m","x":`+strings.Repeat("[", 10<<20)), ErrTooDeep)
	if !strings.Contains(ErrTooDeep.Error(), "512") {
		t.Fatalf("ErrTooDeep does not name the limit: %q", ErrTooDeep)
	}
	if end, ok := ValidValue(nest(MaxDepth+1, "[", "]", ""), 0); ok {
		t.Fatalf("ValidValue accepted %d levels (end %d)", MaxDepth+1, end)
	}
}

// TestValidateZeroAllocs: Validate allocates nothing, valid or not, deep or
// not.
func TestValidateZeroAllocs(t *testing.T) {
	deep := []byte(strings.Repeat("[", 4*MaxDepth))
	doc := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"parameters":{"type":"object","properties":{"a":{"type":"array","items":{"type":"string"}}}}}}]}`)
	var x Index
	x.Valid(doc)
	n := testing.AllocsPerRun(100, func() {
		if Validate(doc) != nil || x.Validate(doc) != nil || Validate(deep) != ErrTooDeep || x.Validate(deep) != ErrTooDeep {
			t.Fatal("wrong verdict")
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// BenchmarkValidate: validating a 100 KB agent request (the gateway does it
// once per call, on the hot path) and refusing an 8 MB body of '['.
func BenchmarkValidate(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"array","items":{"type":"object","properties":{"b":{"type":"string"}}}}}}}}],"messages":[`)
	for i := 0; sb.Len() < 100<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"Run the tests in ./pkg and fix what fails; \"quoted\" text\nwith lines"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"go test ./...\"}"}}]}`)
	}
	sb.WriteString(`]}`)
	req := []byte(sb.String())
	b.Run("request100KB", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(req)))
		for b.Loop() {
			if Validate(req) != nil {
				b.Fatal("not valid")
			}
		}
	})
	b.Run("gjson.Valid/request100KB", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(req)))
		for b.Loop() {
			if !gjson.ValidBytes(req) {
				b.Fatal("not valid")
			}
		}
	})
	deep := []byte(`{"model":"m","x":` + strings.Repeat("[", 8<<20))
	b.Run("deep8MB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if Validate(deep) != ErrTooDeep {
				b.Fatal("not refused")
			}
		}
	})
}
