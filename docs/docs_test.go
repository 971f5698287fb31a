package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/gateway"
	httproute "github.com/rollgate/rollgate/internal/route"
	"github.com/rollgate/rollgate/ui"
)

// outsidePaths are references that point outside the repository: the shared
// design folder of its authors or a machine's home or work folder. They are
// written in two pieces so that this file does not match them itself.
var outsidePaths = []string{"../" + "shared/", "/" + "work/", "/" + "root/"}

// TestNoPathsOutsideRepo fails when a tracked text file mentions a path
// outside the repository: users clone the repository, nothing else.
func TestNoPathsOutsideRepo(t *testing.T) {
	var names []string
	if out, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output(); err == nil {
		names = strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	} else {
		// Not a git work tree (an unpacked archive): every file but
		// dependencies and build output.
		err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if d.Type().IsRegular() {
				rel, _ := filepath.Rel("..", path)
				names = append(names, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("listing the repository's files: %v", err)
		}
	}
	if len(names) < 100 {
		t.Fatalf("only %d files listed: not the repository?", len(names))
	}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			continue // deleted in the work tree, or not a regular file
		}
		if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
			continue // binary
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, p := range outsidePaths {
				if strings.Contains(line, p) {
					t.Errorf("%s:%d mentions %q, a path outside the repository: cite a file in the repository (docs/) or an upstream public source instead", name, i+1, p)
				}
			}
		}
	}
}

// route is one route the gateway serves; Method is "" when the router
// decides it elsewhere (any method matches the contract's).
type route struct{ Method, Path string }

func (r route) String() string { return strings.TrimSpace(r.Method + " " + r.Path) }

var httpMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}

// TestRoutesDocumented reads the surfaces' route tables and checks that
// every route they serve is in docs/contract.md, and that every route the
// contract lists (before "Not yet implemented") is served.
func TestRoutesDocumented(t *testing.T) {
	code := codeRoutes(t)
	if len(code) < 25 {
		t.Fatalf("found only %d routes in the route tables (%v): has a table moved? update codeRoutes", len(code), code)
	}
	t.Logf("%d routes in the route tables: %v", len(code), code)
	doc, err := os.ReadFile("contract.md")
	if err != nil {
		t.Fatal(err)
	}
	served, _, _ := strings.Cut(string(doc), "## Not yet implemented")
	documented := docRoutes(served)
	for _, r := range code {
		if !documented[r.String()] && !(r.Method == "" && anyMethod(documented, r.Path)) {
			t.Errorf("route %s is served by the gateway but not in docs/contract.md", r)
		}
	}
	for d := range documented {
		m, p, _ := strings.Cut(d, " ")
		// The model routes are served under the rollout prefix too.
		p = strings.TrimPrefix(p, "/rollout/{}/attempt/{}")
		found := false
		for _, r := range code {
			if pathMatches(r.Path, p) && (r.Method == m || r.Method == "") {
				found = true
			}
		}
		if !found {
			t.Errorf("docs/contract.md lists %s, which the gateway does not serve: fix the doc or move it under \"Not yet implemented\"", d)
		}
	}
}

// pathMatches reports whether a documented path is served by a route of the
// code, whose {} segments take any value ("/resources/latest").
func pathMatches(code, doc string) bool {
	c, d := strings.Split(code, "/"), strings.Split(doc, "/")
	if len(c) != len(d) {
		return false
	}
	for i := range c {
		if c[i] != d[i] && c[i] != "{}" {
			return false
		}
	}
	return true
}

func anyMethod(documented map[string]bool, path string) bool {
	for m := range httpMethods {
		if documented[m+" "+path] {
			return true
		}
	}
	return false
}

var (
	docRoute    = regexp.MustCompile("`((?:GET|HEAD|POST|PUT|PATCH|DELETE) /[^`?\\s]*)")
	placeholder = regexp.MustCompile(`\{[a-z_]+(\.\.\.)?\}`)
)

// docRoutes returns the "METHOD /path" routes in backquotes in doc, query
// strings cut and {placeholders} written as {}.
func docRoutes(doc string) map[string]bool {
	out := map[string]bool{}
	for _, m := range docRoute.FindAllStringSubmatch(doc, -1) {
		out[placeholder.ReplaceAllString(m[1], "{}")] = true
	}
	return out
}

// codeRoutes reads the routes out of the surfaces' route tables: the
// gateway's own (agent routes, monitoring), the control plane's /api/v1
// (the lease API's under /api/v1/bridge included), Agent Lightning's /api
// and /proxy, and the viewer's /ui. A subtree row of the gateway's (a
// {name...} pattern) is the mount point of another table: each must be one
// that is read here. Parameters are written {}.
func codeRoutes(t *testing.T) []route {
	tables := map[string][]httproute.Info{
		"/api/v1/": controlplane.Routes(),
		"/ui/":     ui.Routes(),
		"":         agl.Routes(),
	}
	var out []route
	add := func(infos []httproute.Info) {
		for _, r := range infos {
			out = append(out, route{r.Method, placeholder.ReplaceAllString(r.Pattern, "{}")})
		}
	}
	for _, r := range gateway.Routes() {
		if !r.Subtree() {
			add([]httproute.Info{r})
		} else if prefix, _ := strings.CutSuffix(r.Pattern, "{path...}"); len(tables[prefix]) == 0 {
			t.Errorf("the gateway mounts %s, whose route table codeRoutes does not read", r.Pattern)
		}
	}
	for _, infos := range tables {
		add(infos)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
