package mock

import (
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/rollgate/rollgate/export/arrays"
	"github.com/rollgate/rollgate/internal/jsonscan"
)

// b2s converts b to a string without copying (jsonscan.String); the string
// must not outlive b's contents.
func b2s(b []byte) string { return jsonscan.String(b) }

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a quoted JSON string. Invalid UTF-8 becomes U+FFFD, as
// Python's errors="replace" would do; non-ASCII text is kept raw (pydantic style).
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendJSONStringBody(dst, s)
	return append(dst, '"')
}

// appendJSONStringBody appends the escaped body of a JSON string (no quotes).
func appendJSONStringBody(dst []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	return append(dst, s[start:]...)
}

// appendIDs appends ids as a JSON array of integers.
func appendIDs(dst []byte, ids []uint32) []byte { return arrays.AppendUint32s(dst, ids) }

// appendRawBytes appends the bytes of s as a JSON list of integers.
func appendRawBytes(dst []byte, s string) []byte {
	dst = append(dst, '[')
	for i := 0; i < len(s); i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(s[i]), 10)
	}
	return append(dst, ']')
}

// appendIDsOrNull appends ids, or null when !ok.
func appendIDsOrNull(dst []byte, ids []uint32, ok bool) []byte {
	if !ok {
		return append(dst, "null"...)
	}
	return appendIDs(dst, ids)
}

// appendFloat appends f the way Python's json module writes floats (always with a
// fraction or exponent); -inf is clamped to -9999.0 as vLLM does for logprobs.
func appendFloat(dst []byte, f float64) []byte {
	if math.IsInf(f, -1) || f < -9999 {
		f = -9999
	}
	if math.IsNaN(f) || math.IsInf(f, 1) {
		f = 0
	}
	n := len(dst)
	dst = strconv.AppendFloat(dst, f, 'g', -1, 64)
	for _, c := range dst[n:] {
		if c == '.' || c == 'e' {
			return dst
		}
	}
	return append(dst, '.', '0')
}

// appendFloat32 appends a float32 in its shortest form.
func appendFloat32(dst []byte, f float32) []byte {
	return strconv.AppendFloat(dst, float64(f), 'g', -1, 32)
}

// appendUsage appends vLLM's UsageInfo object.
func appendUsage(dst []byte, prompt, completion int) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	return append(dst, '}')
}

// appendCompactJSON appends raw JSON with insignificant whitespace removed.
func appendCompactJSON(dst []byte, raw string) []byte {
	inStr, esc := false, false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if inStr {
			dst = append(dst, c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			inStr = true
		}
		dst = append(dst, c)
	}
	return dst
}

// appendHex appends v as 16 lowercase hex digits.
func appendHex(dst []byte, v uint64) []byte {
	for s := 60; s >= 0; s -= 4 {
		dst = append(dst, hexDigits[(v>>uint(s))&0xf])
	}
	return dst
}
