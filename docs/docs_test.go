package docs

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
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

// TestRoutesDocumented reads the gateway's router out of its source and
// checks that every route it serves is in docs/contract.md, and that every
// route the contract lists (before "Not yet implemented") is served.
func TestRoutesDocumented(t *testing.T) {
	code := codeRoutes(t)
	if len(code) < 25 {
		t.Fatalf("found only %d routes in the gateway's source (%v): has the router moved? update codeRoutes", len(code), code)
	}
	t.Logf("%d routes in the gateway's source: %v", len(code), code)
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
	placeholder = regexp.MustCompile(`\{[a-z_]+\}`)
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

// codeRoutes reads the routes out of the router's source: the model routes
// (routeOf), the fixed routes of Handle, the control plane's /api/v1
// switch (ServeAPI), the bridge's routes and the lease API's route table,
// mounted under /api/v1/bridge. Parameters are written {}.
func codeRoutes(t *testing.T) []route {
	var out []route
	for _, p := range caseStrings(t, "../gateway/proxy.go", "routeOf") {
		out = append(out, route{"POST", p})
	}
	for _, p := range caseStrings(t, "../gateway/server.go", "Handle") {
		out = append(out, route{"", p})
	}
	out = append(out, comparedRoutes(t, "../controlplane/api.go", "ServeAPI", "/api/v1", false)...)
	out = append(out, comparedRoutes(t, "../controlplane/bridge.go", "bridgeRoutes", "/api/v1/bridge", true)...)
	for _, r := range tableRoutes(t, "../controlplane/lease/lease.go", "routes") {
		out = append(out, route{r.Method, "/api/v1/bridge" + r.Path})
	}
	for _, pat := range varStrings(t, "../ui/ui.go", "Routes") {
		m, p, _ := strings.Cut(pat, " ")
		out = append(out, route{m, placeholder.ReplaceAllString(p, "{}")})
	}
	// The Agent Lightning surface (controlplane/agl), mounted on the gateway.
	out = append(out, comparedRoutes(t, "../controlplane/agl/agl.go", "Handle", "", false)...)
	for _, p := range caseStrings(t, "../controlplane/agl/proxy.go", "proxy") {
		out = append(out, route{"POST", "/proxy/rollout/{}/attempt/{}/mode/{}/openai/v1" + p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// varList parses file and returns the composite literal assigned to its
// package-level variable name.
func varList(t *testing.T, file, name string) *ast.CompositeLit {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, sp := range gd.Specs {
			vs := sp.(*ast.ValueSpec)
			if len(vs.Names) != 1 || vs.Names[0].Name != name || len(vs.Values) != 1 {
				continue
			}
			if list, ok := vs.Values[0].(*ast.CompositeLit); ok {
				return list
			}
		}
	}
	t.Fatalf("%s: no list %s: has the router moved? update codeRoutes", file, name)
	return nil
}

// varStrings returns the string literals of the list assigned to the
// package-level variable name of file.
func varStrings(t *testing.T, file, name string) []string {
	t.Helper()
	var out []string
	for _, e := range varList(t, file, name).Elts {
		if s, ok := stringLit(e); ok {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: %s holds no strings: has the router moved? update codeRoutes", file, name)
	}
	return out
}

// tableRoutes reads a route table out of file: the package-level variable
// name, a slice of composite literals whose first two elements are the
// method and the path as string literals.
func tableRoutes(t *testing.T, file, name string) []route {
	t.Helper()
	var out []route
	for _, e := range varList(t, file, name).Elts {
		if cl, ok := e.(*ast.CompositeLit); ok && len(cl.Elts) >= 2 {
			m, okM := stringLit(cl.Elts[0])
			p, okP := stringLit(cl.Elts[1])
			if okM && okP {
				out = append(out, route{m, p})
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: %s holds no routes: has the router moved? update codeRoutes", file, name)
	}
	return out
}

// funcBody parses file and returns the body of its function (or method) name.
func funcBody(t *testing.T, file, name string) *ast.BlockStmt {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == name && fd.Body != nil {
			return fd.Body
		}
	}
	t.Fatalf("%s: no function %s: has the router moved? update codeRoutes", file, name)
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
		s, err := strconv.Unquote(bl.Value)
		return s, err == nil
	}
	return "", false
}

// caseStrings returns the string literals starting with "/" that label the
// cases of the switches in function fn.
func caseStrings(t *testing.T, file, fn string) []string {
	var out []string
	ast.Inspect(funcBody(t, file, fn), func(n ast.Node) bool {
		if cc, ok := n.(*ast.CaseClause); ok {
			for _, e := range cc.List {
				if s, ok := stringLit(e); ok && strings.HasPrefix(s, "/") {
					out = append(out, s)
				}
			}
		}
		return true
	})
	return out
}

// comparedRoutes reads routes from the conditions of function fn's switch
// cases (and, with ifs, its if statements): a comparison of sub with "/x"
// gives prefix+"/x"; comparisons of parts[i] with literals and of
// len(parts) with n give prefix/parts[0]/{}/parts[2]; a comparison with an
// HTTP method name gives the method. Conditions without a method are not
// routes.
func comparedRoutes(t *testing.T, file, fn, prefix string, ifs bool) []route {
	var out []route
	add := func(cond ast.Expr) {
		var method, sub string
		parts := map[int]string{}
		n := -1
		ast.Inspect(cond, func(x ast.Node) bool {
			be, ok := x.(*ast.BinaryExpr)
			if !ok || be.Op != token.EQL {
				return true
			}
			if s, ok := stringLit(be.Y); ok {
				switch {
				case httpMethods[s]:
					method = s
				case isIdent(be.X, "sub"):
					sub = s
				default:
					if ix, ok := be.X.(*ast.IndexExpr); ok && isIdent(ix.X, "parts") {
						if i, ok := intLit(ix.Index); ok {
							parts[i] = s
						}
					}
				}
			}
			if c, ok := be.X.(*ast.CallExpr); ok && isIdent(c.Fun, "len") && len(c.Args) == 1 && isIdent(c.Args[0], "parts") {
				if i, ok := intLit(be.Y); ok {
					n = i
				}
			}
			return true
		})
		switch {
		case method == "":
		case sub != "":
			out = append(out, route{method, prefix + sub})
		case n > 0:
			segs := make([]string, n)
			for i := range segs {
				if segs[i] = parts[i]; segs[i] == "" {
					segs[i] = "{}"
				}
			}
			out = append(out, route{method, prefix + "/" + strings.Join(segs, "/")})
		}
	}
	ast.Inspect(funcBody(t, file, fn), func(n ast.Node) bool {
		switch s := n.(type) {
		case *ast.CaseClause:
			for _, e := range s.List {
				add(e)
			}
		case *ast.IfStmt:
			if ifs {
				add(s.Cond)
			}
		}
		return true
	})
	return out
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func intLit(e ast.Expr) (int, bool) {
	if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.INT {
		i, err := strconv.Atoi(bl.Value)
		return i, err == nil
	}
	return 0, false
}
