package air

import (
	"regexp"
	"strings"
	"testing"
)

// patternSeeds are (pattern, text) pairs: the default patterns on texts
// that match them (in other cases, with folds that are not ASCII) or not,
// and patterns of every construct that required reads.
func patternSeeds() [][2]string {
	texts := []string{
		"", "ok", "Error: city not found", "  FATAL: x", "exception", "errors: none", "no error here",
		"Traceback (most recent call last):\n  File \"x\"", "TRACEBACK (MOST RECENT CALL LAST)", "TRACEBAC\u212a (most recent call last)",
		"bash: foo: command not found", "ls: x: No such file or directory", "no ſuch file or directory", "PERMISSION DENIED",
		"request timed out.", "Connection refused", "connection refusedx", `{"status": "FAILED"}`, `{"error" : "failure"}`,
		`{"error": {"code": 1}}`, `{"Error":{}}`, "\xff error", "error \xff", "t\u0131med out", "the file function return value test",
	}
	var seeds [][2]string
	for _, p := range DefaultFailurePatterns {
		for _, t := range texts {
			seeds = append(seeds, [2]string{p, t})
		}
	}
	for _, p := range []string{
		`abc`, `(?i)abc`, `(?-i:ABC)`, `a+bcd`, `(abc)+`, `(abc){2,}`, `(abc){0,3}`, `x{0}abcd`, `(?:abc|)`, `(?:abc|def)?`,
		`\Qa.b\E`, `[a-c]bcd`, `(?i)ſtop`, `(?i)\x{212A}elvin`, `(?i)kelvin`, `(?i)sstop`, `abc|de`, `(?s).*abc`, `^abc$`, `\babc\b`,
		`a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r`, `(?i)(?:alpha|beta|gamma)(?:delta|epsilon)`, `(?i)é+abc`, `\x00abc`, `[^a]abc`, `(?U)abc+?`,
	} {
		for _, t := range []string{"abc", "ABC", "xxabcxx", "ſtop", "STOP", "\u212aelvin", "KELVIN", "de", "a.b", "abcabc", "alphaDELTA", "éabc", "\x00ABC"} {
			seeds = append(seeds, [2]string{p, t})
		}
	}
	return seeds
}

// FuzzPatternLiterals: a pattern with its literals matches every text as
// regexp's MatchString does.
func FuzzPatternLiterals(f *testing.F) {
	for _, s := range patternSeeds() {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, p, text string) {
		re, err := regexp.Compile(p)
		pat, err2 := compilePattern(p)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("%q: regexp.Compile %v, compilePattern %v", p, err, err2)
		}
		if err != nil {
			return
		}
		var m matcher
		for range 2 { // a new matcher, then one reset
			m.reset(text)
			if got, want := m.match(&pat), re.MatchString(text); got != want {
				t.Fatalf("%q on %q: %v, MatchString %v (literals %q)", p, text, got, want, pat.lits)
			}
		}
	})
}

// TestDefaultPatternLiterals: every default pattern has literals, so that
// texts without them are not read by regexp.
func TestDefaultPatternLiterals(t *testing.T) {
	var got []string
	for _, p := range DefaultFailurePatterns {
		pat, err := compilePattern(p)
		if err != nil {
			t.Fatal(err)
		}
		var ls []string
		for _, l := range pat.lits {
			ls = append(ls, string(l))
		}
		got = append(got, strings.Join(ls, "|"))
	}
	want := []string{"rror|xception|fatal", "traceback (most recent call last)",
		"command not found|no such file or directory|permission denied|timed out|connection refused", "error|status", `"error"`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("literals:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// BenchmarkPatterns times the default patterns on the agentic attempt's
// tool results (about 200 bytes each, no match): regexp's MatchString
// alone, and with the literals (matcher).
func BenchmarkPatterns(b *testing.B) {
	var texts []string
	msgs, _, _ := decodeRequest(agenticRequest(4))
	for _, m := range msgs {
		if m.Role == "tool" {
			texts = append(texts, m.text())
		}
	}
	var pats []pattern
	for _, p := range DefaultFailurePatterns {
		pat, _ := compilePattern(p)
		pats = append(pats, pat)
	}
	b.Run("MatchString", func(b *testing.B) {
		for b.Loop() {
			for _, t := range texts {
				for i := range pats {
					if pats[i].re.MatchString(t) {
						b.Fatal(t)
					}
				}
			}
		}
	})
	b.Run("matcher", func(b *testing.B) {
		b.ReportAllocs()
		var m matcher
		for b.Loop() {
			for _, t := range texts {
				m.reset(t)
				for i := range pats {
					if m.match(&pats[i]) {
						b.Fatal(t)
					}
				}
			}
		}
	})
}
