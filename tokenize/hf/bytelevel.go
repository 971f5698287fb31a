package hf

import "unicode/utf8"

// byteToRune and runeToByte are GPT-2's bytes_to_unicode table: printable
// bytes map to themselves, the others to U+0100 onwards, so every byte has a
// visible character in a byte-level vocabulary.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		runeToByte[r] = byte(b)
	}
}

// ByteLevel returns the byte-level form of raw bytes (how a tokenizer.json
// vocabulary spells them).
func ByteLevel(raw []byte) string {
	out := make([]rune, len(raw))
	for i, b := range raw {
		out[i] = byteToRune[b]
	}
	return string(out)
}

// unByteLevel turns a byte-level vocabulary entry back into its bytes; false
// when it holds a character outside the table.
func unByteLevel(tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r == utf8.RuneError {
			return "", false
		}
		b, ok := runeToByte[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), true
}
