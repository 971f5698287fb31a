package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// maxDepth bounds the nesting of decoded JSON (captured data is untrusted).
const maxDepth = 200

// decodeValue turns JSON into template values: objects become *exec.Dict
// (key order kept, as Python dicts keep it), arrays []any, integers int,
// other numbers float64.
func decodeValue(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeNext(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

func decodeNext(dec *json.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("JSON nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			d := exec.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				val, err := decodeNext(dec, depth+1)
				if err != nil {
					return nil, err
				}
				key := k.(string)
				replaced := false
				for _, p := range d.Pairs { // a repeated key keeps its first place, with the last value (Python)
					if p.Key.String() == key {
						p.Value, replaced = exec.AsValue(val), true
					}
				}
				if !replaced {
					d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: exec.AsValue(val)})
				}
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return d, nil
		case '[':
			l := []any{}
			for dec.More() {
				val, err := decodeNext(dec, depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, val)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return l, nil
		}
		return nil, fmt.Errorf("unexpected %v", v)
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil && i >= math.MinInt && i <= math.MaxInt {
			return int(i), nil
		}
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("number %s: %w", v, err)
		}
		return f, nil
	default: // string, bool, nil
		return v, nil
	}
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=indent, sort_keys=False).
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	indent := -1
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		if !v.IsInteger() {
			return exec.AsValue(fmt.Errorf("tojson: indent %s is not an integer", v.String()))
		}
		indent = v.Integer()
	}
	var b strings.Builder
	if err := writeJSON(&b, in, indent, 0, 0); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	return exec.AsSafeValue(b.String())
}

// writeJSON writes v as Python's json.dumps does.
func writeJSON(b *strings.Builder, v *exec.Value, indent, level, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("value nested deeper than %d", maxDepth)
	}
	if v == nil || v.IsNil() {
		b.WriteString("null")
		return nil
	}
	newline := func(l int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*l))
		}
	}
	itemSep := ", "
	if indent >= 0 {
		itemSep = ","
	}
	switch x := v.Interface().(type) {
	case *exec.Value:
		return writeJSON(b, x, indent, level, depth+1)
	case *exec.Dict:
		return writeDict(b, x, indent, level, depth, newline, itemSep)
	case exec.Dict:
		return writeDict(b, &x, indent, level, depth, newline, itemSep)
	case map[string]any: // namespace() and dict() values
		d := exec.NewDict()
		for _, k := range sortedKeys(x) {
			d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(x[k])})
		}
		return writeDict(b, d, indent, level, depth, newline, itemSep)
	case string:
		writeString(b, x)
		return nil
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[x])
		return nil
	case int:
		b.WriteString(strconv.Itoa(x))
		return nil
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
		return nil
	case float64:
		b.WriteString(pyFloat(x))
		return nil
	case error:
		return x
	}
	switch {
	case v.IsList():
		n := v.Len()
		if n == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(level + 1)
			if err := writeJSON(b, v.Index(i), indent, level+1, depth+1); err != nil {
				return err
			}
		}
		newline(level)
		b.WriteByte(']')
		return nil
	case v.IsString():
		writeString(b, v.String())
		return nil
	case v.IsBool():
		b.WriteString(map[bool]string{true: "true", false: "false"}[v.Bool()])
		return nil
	case v.IsInteger():
		b.WriteString(strconv.Itoa(v.Integer()))
		return nil
	case v.IsFloat():
		b.WriteString(pyFloat(v.Float()))
		return nil
	}
	return fmt.Errorf("cannot write %s as JSON", v.String())
}

func writeDict(b *strings.Builder, d *exec.Dict, indent, level, depth int, newline func(int), itemSep string) error {
	if len(d.Pairs) == 0 {
		b.WriteString("{}")
		return nil
	}
	b.WriteByte('{')
	for i, p := range d.Pairs {
		if i > 0 {
			b.WriteString(itemSep)
		}
		newline(level + 1)
		writeString(b, p.Key.String())
		b.WriteString(": ")
		if err := writeJSON(b, p.Value, indent, level+1, depth+1); err != nil {
			return err
		}
	}
	newline(level)
	b.WriteByte('}')
	return nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeString writes s as a JSON string the way Python's json.dumps with
// ensure_ascii=False does: only '"', '\\' and control characters escaped.
func writeString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[r>>4])
			b.WriteByte(hex[r&0xf])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}

// pyFloat formats f as Python's repr(float) does (what json.dumps writes).
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // shortest digits: d.ddde±XX
	mant, expS, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expS)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}
