package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// githubAnchor is the id GitHub gives a heading: link syntax and code marks
// dropped, lower case, punctuation other than '-' and '_' removed, spaces as '-'.
func githubAnchor(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestReadmeAnchors: every in-page link of README.md (its contents, the
// cross-references between sections) names a heading that exists.
func TestReadmeAnchors(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if !inFence && strings.HasPrefix(line, "#") {
			anchors[githubAnchor(strings.TrimLeft(line, "#"))] = true
		}
	}
	links := regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(string(b), -1)
	if len(links) < 10 {
		t.Fatalf("only %d in-page links in README.md: has its contents gone?", len(links))
	}
	for _, m := range links {
		if !anchors[m[1]] {
			t.Errorf("README.md links to #%s, which no heading has", m[1])
		}
	}
}
