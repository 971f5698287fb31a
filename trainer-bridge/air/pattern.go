package air

import (
	"bytes"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"
)

// pattern is a failure pattern and the strings of which each of its matches
// holds one, found in its syntax: on an ASCII text, a pattern can match only
// when the text holds one of them, ASCII case ignored. Most tool results
// hold none of the default patterns' (error, exception, fatal, traceback
// (most recent call last), command not found, no such file or directory,
// ...), and finding that out takes a few string searches, while Go's regexp
// reads the text byte by byte once per pattern (the ones without a literal
// prefix are the costly ones: 100 ns a byte for the third default pattern).
type pattern struct {
	re *regexp.Regexp
	// lits are in ASCII lower case, at least minLit bytes each; nil when
	// the syntax shows none (then the pattern is matched on every text).
	lits [][]byte
}

// minLit is the length below which literals are not worth looking for
// (a text usually holds them).
const minLit = 3

// compilePattern compiles p as regexp.Compile does and finds its literals.
func compilePattern(p string) (pattern, error) {
	re, err := regexp.Compile(p)
	if err != nil {
		return pattern{}, err
	}
	pat := pattern{re: re}
	// regexp.Compile parses p with the Perl flags too: the tree is the one
	// whose language it matches (before simplification, which keeps it).
	tree, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return pat, nil // not seen (regexp.Compile parsed it): matched on every text
	}
	lits := required(tree)
	if lits == nil || shortest(lits) < minLit {
		return pat, nil
	}
	for _, l := range lits {
		pat.lits = append(pat.lits, []byte(l))
	}
	return pat, nil
}

// maxLits bounds the strings that required returns for one pattern.
const maxLits = 16

// required returns strings of which every match of re holds one, in ASCII
// lower case, or nil when it finds none. A match holds a match of each
// part of a concatenation (the part with the longest shortest string is
// chosen), of the repeated expression of x+ and x{n,} with n >= 1, of the
// expression in a group, and of one branch of an alternation (every branch
// must have strings); a literal is its own string when it is ASCII (a
// literal that folds case matches, on an ASCII text, only its letters in
// either case; a literal that does not fold case is looked for with case
// ignored too, which finds more than it matches, never less). Anything else
// (classes, empty-width assertions, x*, x?, non-ASCII literals, whose folds
// may be ASCII: K is the Kelvin sign's) shows no string.
func required(re *syntax.Regexp) []string {
	switch re.Op {
	case syntax.OpLiteral:
		for _, r := range re.Rune {
			if r >= utf8.RuneSelf {
				return nil
			}
		}
		return []string{strings.ToLower(string(re.Rune))}
	case syntax.OpCapture, syntax.OpPlus:
		return required(re.Sub[0])
	case syntax.OpRepeat:
		if re.Min >= 1 {
			return required(re.Sub[0])
		}
	case syntax.OpConcat:
		var best []string
		for _, sub := range re.Sub {
			if l := required(sub); l != nil && (best == nil || shortest(l) > shortest(best)) {
				best = l
			}
		}
		return best
	case syntax.OpAlternate:
		var all []string
		for _, sub := range re.Sub {
			l := required(sub)
			if l == nil || len(all)+len(l) > maxLits {
				return nil
			}
			all = append(all, l...)
		}
		return all
	}
	return nil
}

// shortest returns the length of the shortest of ls.
func shortest(ls []string) int {
	n := len(ls[0])
	for _, l := range ls[1:] {
		n = min(n, len(l))
	}
	return n
}

// matcher matches patterns on one text at a time, keeping its lower-case
// copy for their literals.
type matcher struct {
	text    string
	lowered bool   // lower and ascii are set for text
	ascii   bool   // text is ASCII
	lower   []byte // text in ASCII lower case, when ascii
}

// reset makes m match on text (keeping the buffer).
func (m *matcher) reset(text string) { m.text, m.lowered = text, false }

// match reports whether p matches the text, as p.re.MatchString does.
func (m *matcher) match(p *pattern) bool {
	if p.lits != nil {
		if !m.lowered {
			m.lower, m.ascii = lowerASCII(m.lower[:0], m.text)
			m.lowered = true
		}
		if m.ascii && !containsAny(m.lower, p.lits) {
			return false
		}
	}
	return p.re.MatchString(m.text)
}

// lowerASCII appends s in ASCII lower case to dst and reports whether s is
// ASCII (when it is not, dst holds only the bytes before the first that is
// not).
func lowerASCII(dst []byte, s string) ([]byte, bool) {
	dst = slices.Grow(dst, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			return dst, false
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst, true
}

// containsAny reports whether b holds one of lits.
func containsAny(b []byte, lits [][]byte) bool {
	for _, l := range lits {
		if bytes.Contains(b, l) {
			return true
		}
	}
	return false
}
