package air

import (
	"encoding/json"
	"strings"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// toolArgs decodes a tool call's arguments as toolArgsDecoded does. An
// object that nothing but whitespace, ']' or '}' follows is read by
// fastArgs; whatever it does not follow exactly goes to encoding/json.
func toolArgs(s string) (map[string]any, bool) {
	if v, ok, known := fastArgs(jsonscan.Bytes(s)); known {
		return v, ok
	}
	return toolArgsDecoded(s)
}

// toolArgsDecoded decodes a tool call's arguments with a json.Decoder
// (UseNumber): ok when its first value is an object and no other value
// follows (Decode succeeds and More is false: what follows is whitespace,
// or starts with ']' or '}').
func toolArgsDecoded(s string) (map[string]any, bool) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil || d.More() {
		return nil, false
	}
	m, ok := v.(map[string]any)
	return m, ok
}

// fastArgs decodes b as toolArgsDecoded does and reports known, or reports
// known false when it leaves b to encoding/json: when b holds, after
// whitespace, an object that is not valid JSON (gjson's rules, which are
// encoding/json's but for its nesting limit, checked first on long texts)
// or nests deeper than that limit. Whitespace and anything but an object
// is not ok (Decode fails or decodes another value).
func fastArgs(b []byte) (v map[string]any, ok, known bool) {
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false, true
	}
	if len(b) > 2*maxDepth && !shallow(b) {
		return nil, false, false
	}
	end, valid := jsonscan.ValidValue(b, i)
	if !valid {
		return nil, false, false
	}
	if j := jsonscan.SkipWS(b, end); j < len(b) && b[j] != ']' && b[j] != '}' {
		return nil, false, true // More
	}
	m, _ := anyValue(b, i)
	return m.(map[string]any), true, true
}

// anyValue decodes the value at b[i], valid JSON, as encoding/json decodes
// it into an any with UseNumber (objects as maps, where the last of a key
// wins, arrays as slices, [] not nil, numbers as their text), and returns
// the offset after it.
func anyValue(b []byte, i int) (any, int) {
	switch b[i] {
	case '{':
		m := map[string]any{}
		for i = jsonscan.SkipWS(b, i+1); b[i] != '}'; {
			end := jsonscan.SkipString(b, i)
			k := unquote(b[i+1 : end-1])
			i = jsonscan.SkipWS(b, jsonscan.SkipWS(b, end)+1) // after the colon
			m[k], i = anyValue(b, i)
			if i = jsonscan.SkipWS(b, i); b[i] == ',' {
				i = jsonscan.SkipWS(b, i+1)
			}
		}
		return m, i + 1
	case '[':
		a := []any{}
		for i = jsonscan.SkipWS(b, i+1); b[i] != ']'; {
			var e any
			e, i = anyValue(b, i)
			a = append(a, e)
			if i = jsonscan.SkipWS(b, i); b[i] == ',' {
				i = jsonscan.SkipWS(b, i+1)
			}
		}
		return a, i + 1
	case '"':
		end := jsonscan.SkipString(b, i)
		return unquote(b[i+1 : end-1]), end
	case 't':
		return true, i + len("true")
	case 'f':
		return false, i + len("false")
	case 'n':
		return nil, i + len("null")
	}
	end, _ := jsonscan.ValidValue(b, i) // a number
	return json.Number(b[i:end]), end
}
