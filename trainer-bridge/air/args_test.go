package air

import (
	"reflect"
	"strings"
	"testing"
)

// FuzzToolArgsMatchesEncodingJSON: toolArgs reads all arguments as
// toolArgsDecoded (a json.Decoder) does.
func FuzzToolArgsMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"city":"Paris"}`, `{"city": "Paris", "unit": "c"}`, ` { "q" : "x" , "n" : 1 } `, `{"command":"sed -n 1,50p src/a.py"}`,
		`{"a":1,"a":2}`, `{"a":{"x":1},"a":{"y":2}}`, `{"A":1,"a":2}`, `{"a":[],"b":{},"c":[[]],"d":[{}]}`,
		`{"a":{"b":[1,2.5e3,-0,-0.0E-0,1e400,123456789012345678901234567890,true,false,null,"x\u00e9\n"]}}`,
		`{"\u0041\ud800\udfff":"\ud83d\ude00 \ud83d \udfff","a\"b":"c\\d\/"}`, "{\"\xff\":\"\xfe\xc3\"}",
		// what follows the object
		`{} `, `{}]`, `{}}`, `{} ] x`, `{} x`, `{}{}`, `{},`, `{}[`, `{}"`, `{}1`, "{}\n\t}", `{}:`,
		// not an object, invalid
		``, ` `, `[1]`, `[{}]`, `"x"`, `5`, `null`, `true`, `{`, `{"a":}`, `{"a":1`, `{"a":1,}`, `{"a" 1}`, `{a:1}`,
		`{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":tru}`, "{\"a\":\"\x01\"}", `{"a":"\x"}`, `{"a":"\u12G4"}`, "\xef\xbb\xbf{}",
		`{"a":` + strings.Repeat("[", 50) + strings.Repeat("]", 50) + `}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := toolArgs(s)
		wv, wok := toolArgsDecoded(s)
		if ok != wok || !reflect.DeepEqual(v, wv) {
			t.Fatalf("%.300q:\ntoolArgs      %#v %v\nencoding/json %#v %v", s, v, ok, wv, wok)
		}
	})
}

// TestToolArgsDepth: encoding/json's nesting limit, and no deep recursion
// on many openings.
func TestToolArgsDepth(t *testing.T) {
	nested := func(depth int) string { // the object is one level
		return `{"a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
	}
	for s, want := range map[string]bool{
		nested(maxDepth): true, nested(maxDepth + 1): false, `{"a":` + strings.Repeat("[", 1<<20): false,
		`{"a":1}` + strings.Repeat("]", maxDepth+1): true, `{"a":1}` + strings.Repeat("[", maxDepth+1): false,
	} {
		v, ok := toolArgs(s)
		wv, wok := toolArgsDecoded(s)
		if ok != want || wok != want || !reflect.DeepEqual(v, wv) {
			t.Errorf("%.40q... (%d bytes): toolArgs %v, encoding/json %v, want %v", s, len(s), ok, wok, want)
		}
	}
}

// BenchmarkToolArgs times toolArgs and toolArgsDecoded on the agentic
// attempt's two kinds of arguments.
func BenchmarkToolArgs(b *testing.B) {
	args := []string{`{"command":"sed -n 1,50p src/util/config.py"}`, `{"path":"src/main/handler.py","offset":50}`}
	for _, v := range []struct {
		name string
		read func(string) (map[string]any, bool)
	}{{"encoding_json", toolArgsDecoded}, {"toolArgs", toolArgs}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, a := range args {
					if _, ok := v.read(a); !ok {
						b.Fatal(a)
					}
				}
			}
		})
	}
}
