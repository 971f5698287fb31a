package route

import "testing"

// TestMatch: each kind of pattern, the method rules and Lookup, f-tests.
func TestMatch(t *testing.T) {
	tb := New(
		Route[int]{Method: "GET", Pattern: "/a", Handler: 1},
		Route[int]{Method: "POST", Pattern: "/a/{id}/b", Handler: 2},
		Route[int]{Pattern: "/s/{rest...}", Handler: 3},
		Route[int]{Method: "GET", Pattern: "/a/{id}", Handler: 4},
	)
	f := func(method, path, want string) {
		t.Helper()
		if got := tb.Match(method, path, nil).String(); got != want {
			t.Errorf("%s %s: %q, want %q", method, path, got, want)
		}
	}
	f("GET", "/a", "GET /a")
	f("HEAD", "/a", "405") // HEAD is its own method unless HeadAsGet
	f("POST", "/a", "405")
	f("POST", "/a/", "405") // a fixed path matches exactly; its trimmed form is known (405)
	f("GET", "/a/x", "GET /a/{id} x")
	f("GET", "//a/x/", "GET /a/{id} x") // segments: trimmed, then split
	f("POST", "/a/x/b", "POST /a/{id}/b x")
	f("GET", "/a/x/b", "405")
	f("GET", "/a//b", "405") // an empty segment is a parameter's value
	f("DELETE", "/s/x/y", " /s/{rest...} x/y")
	f("GET", "/s", "404")
	f("GET", "/b", "404")
	tb.HeadAsGet()
	f("HEAD", "/a", "GET /a")

	for path, want := range map[string]int{"/a": 1, "/s/": 3, "/s/q": 3, "/a/x": 0, "/": 0, "": 0} {
		got := 0
		if r := tb.Lookup([]byte(path)); r != nil {
			got = r.Handler
		}
		if got != want {
			t.Errorf("Lookup(%q) = %d, want %d", path, got, want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { tb.Lookup([]byte("/s/q")) }); a != 0 {
		t.Errorf("Lookup allocates %.1f times", a)
	}
}

// TestBadPatternsPanic: a table is a literal of the program; a malformed
// pattern is a bug found at start.
func TestBadPatternsPanic(t *testing.T) {
	for _, p := range []string{"a", "/a/{b", "/a/b}", "/a/{b...}/c", "/a/x{b}", "/a/x{b...}", "/a//{b}"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("pattern %q accepted", p)
				}
			}()
			New(Route[int]{Pattern: p})
		}()
	}
}

// TestSplitWith: a table's own split, and Invalid when it refuses a path.
func TestSplitWith(t *testing.T) {
	tb := New(Route[int]{Pattern: "/f"}, Route[int]{Pattern: "/x/{id}"}).SplitWith(func(p string) ([]string, bool) {
		return []string{"x", p[3:]}, p != "/x/bad"
	})
	if m := tb.Match("GET", "/f", nil); m.Route == nil || m.Invalid {
		t.Errorf("fixed row behind a split: %+v", m)
	}
	if m := tb.Match("GET", "/x/bad", nil); !m.Invalid || m.Route != nil {
		t.Errorf("refused split: %+v", m)
	}
	if m := tb.Match("GET", "/x/ok", nil); m.String() != " /x/{id} ok" {
		t.Errorf("split: %s", m)
	}
}
