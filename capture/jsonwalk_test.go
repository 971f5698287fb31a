package capture

import (
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzValidIndex: containerEnds.validIndex accepts exactly what gjson.Valid
// accepts, and every end it records is where valueEnd finds that
// container's end.
func FuzzValidIndex(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2,{"b":"c\"]"}],"d":{}}`, ` [ ] `, `{"a":1,}`, `[1,]`, `01`, `-`, `-0.5e+3`, `1.`, `1e`,
		`"\u12G4"`, `"\x"`, "\"a\x01\"", `{"a" 1}`, `{"a":1 "b":2}`, `tru`, `nulll`, `[[[]]]`, `{"a":[}`, ``, ` `,
		`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.5}]}}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var x containerEnds
		got, want := x.validIndex(s), gjson.Valid(s)
		if got != want {
			t.Fatalf("validIndex %v, gjson.Valid %v", got, want)
		}
		if !got {
			if x.n != 0 {
				t.Fatal("invalid text left indexed")
			}
			return
		}
		for i, e := range x.ends[:len(s)] {
			if e == 0 {
				continue
			}
			if s[i] != '{' && s[i] != '[' {
				t.Fatalf("end recorded at %d, %q", i, s[i])
			}
			if v := valueEnd(s, i); v != int(e) {
				t.Fatalf("container at %d: recorded end %d, valueEnd %d", i, e, v)
			}
			if x.valueEnd(s, i) != int(e) {
				t.Fatalf("container at %d: indexed valueEnd differs", i)
			}
		}
		x.clear()
	})
}
