package gateway

import (
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// idRef is the documented id syntax, as a regular expression.
var idRef = regexp.MustCompile(`^[A-Za-z0-9._:@+=~-]{1,128}$`)

// nameRef is the documented name rule written another way.
func nameRef(b []byte) bool {
	if len(b) > MaxNameLen || !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return false
		}
	}
	return true
}

func TestValidID(t *testing.T) {
	for _, ok := range []string{"a", "ro-1a2b3c4d5e6f", "at-1", "task:7@v2", "x.y_z+w=v~u", strings.Repeat("r", 128)} {
		if !ValidID([]byte(ok)) {
			t.Errorf("ValidID(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", "x\r\nSet-Cookie: a=b", "a b", "a/b", "a?b", "a#b", "a%0d", "a\x00b", "é", `a"b`, "a\\b", strings.Repeat("r", 129)} {
		if ValidID([]byte(bad)) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"", "solver", "Math Agent", "résumé-writer", "数学", strings.Repeat("n", 256)} {
		if !ValidName([]byte(ok)) {
			t.Errorf("ValidName(%q) = false", ok)
		}
	}
	for _, bad := range []string{"a\nb", "a\rb", "a\x00", "a\x7f", "a\u0085b", "a\u2028b", "\xff\xfe", strings.Repeat("n", 257)} {
		if ValidName([]byte(bad)) {
			t.Errorf("ValidName(%q) = true", bad)
		}
	}
}

// FuzzValidID checks the id and name rules against their references, and
// that an accepted id can never split a header, a path or a log line.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{"ro-1", "x\r\nSet-Cookie: a=b", "a b", strings.Repeat("r", 129), "\u0085", "数学", "a\x7f"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := ValidID(b), idRef.Match(b); got != want {
			t.Fatalf("ValidID(%q) = %v, reference %v", b, got, want)
		}
		if ValidID(b) && strings.ContainsAny(string(b), "\r\n\x00 /?#%\"\\") {
			t.Fatalf("ValidID accepted %q", b)
		}
		if got, want := ValidName(b), nameRef(b); got != want {
			t.Fatalf("ValidName(%q) = %v, reference %v", b, got, want)
		}
		if ValidName(b) && strings.ContainsAny(string(b), "\r\n\x00") {
			t.Fatalf("ValidName accepted %q", b)
		}
	})
}

// TestInternerBounded: the interner keeps at most max strings and maxBytes,
// never keeps a value longer than maxLen, and still returns equal strings.
func TestInternerBounded(t *testing.T) {
	in := interner{max: 100, maxBytes: 10 << 10, maxLen: 256}
	for i := range 5000 {
		v := []byte(strings.Repeat("m", 200) + string(rune('a'+i%26)) + strings.Repeat("x", i%50))
		if got := in.get(v); got != string(v) {
			t.Fatalf("get returned %q", got)
		}
		if n, b := in.size(); n > in.max || b > in.maxBytes {
			t.Fatalf("after %d names: %d held, %d bytes", i+1, n, b)
		}
	}
	long := []byte(strings.Repeat("L", 4<<20))
	if got := in.get(long); got != string(long) {
		t.Fatal("long value changed")
	}
	if _, ok := in.m[string(long)]; ok {
		t.Fatal("a value over maxLen was kept")
	}
}
