// Package route holds the route tables of rollgate's HTTP surfaces. Each
// surface (the agent routes of gateway/, the control plane's /api/v1,
// Agent Lightning's /api and /proxy in controlplane/agl, the viewer's /ui)
// lists its routes as rows of one Table — method, pattern, auth, handler —
// and finds a request's row with Table.Match; docs/docs_test.go reads the
// tables (Infos) to check that docs/contract.md lists every route.
//
// A pattern is a path whose segments are literals or parameters:
//
//	/v1/chat/completions                  a fixed path: matches the path exactly
//	/rollouts/{rollout_id}/rewards        {name}: any one segment
//	/bridge/{rest...}                     {name...} last: the raw rest of the path (a subtree)
//
// A fixed pattern matches the path byte for byte. A pattern with {name}
// segments matches the path's segments: the path trimmed of slashes at both
// ends and split at every slash (Table.SplitWith can change that); literal
// segments are compared, parameters take any segment, empty ones included
// (the surfaces validate their ids themselves). A {name...} pattern
// matches every path starting with the literal prefix before it.
package route

import (
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"
)

// Auth is the credential a route asks for.
type Auth string

const (
	// Open routes answer every caller (monitoring: liveness, readiness,
	// metrics); they change nothing.
	Open Auth = "none"
	// ClientKey routes are the agents': a key of the gateway's client_keys
	// when any is set (checked by the proxy path).
	ClientKey Auth = "client key"
	// Admin routes need the admin token when one is set (/api/v1, /ui,
	// the lease API).
	Admin Auth = "admin token"
	// AGLKey routes need Agent Lightning's key (agl.key) when one is set.
	AGLKey Auth = "agl key"
	// Mounted routes are a subtree served by another table, which says
	// its own routes' auth.
	Mounted Auth = "the mounted table's"
)

// Route is one row of a table.
type Route[H any] struct {
	// Method is the HTTP method served ("" leaves the method to the
	// handler; Table.GetServesHead makes GET serve HEAD).
	Method string
	// Pattern is the path served (see the package comment).
	Pattern string
	// Auth is the credential the route asks for.
	Auth Auth
	// Handler serves the route; its type is the surface's.
	Handler H
}

// Info is a row without its handler: what the docs test reads.
type Info struct {
	Method, Pattern string
	Auth            Auth
}

func (i Info) String() string { return strings.TrimSpace(i.Method + " " + i.Pattern) }

// Subtree reports whether the pattern ends in a {name...} segment (a
// mount point whose routes another table lists).
func (i Info) Subtree() bool { return strings.HasSuffix(i.Pattern, "...}") }

// Table is a surface's routes, matched in order (the first row that
// matches the path and the method wins).
type Table[H any] struct {
	rows          []row[H]
	byLen         [][]int                            // fixed rows by their pattern's length, in order (Lookup)
	subtrees      []int                              // the subtree rows, in order (Lookup)
	split         func(path string) ([]string, bool) // SplitWith; nil: splitTrimmed
	getServesHead bool                               // HeadAsGet
}

// HeadAsGet makes t's GET rows serve HEAD too (net/http's rule); otherwise
// HEAD is a method of its own. It returns t.
func (t *Table[H]) HeadAsGet() *Table[H] {
	t.getServesHead = true
	return t
}

// SplitWith makes split turn a path into the segments matched against
// {name} patterns (the default trims the slashes at both ends and splits at
// every slash); split returns false when the path has no valid segments,
// and Match then reports Invalid. It returns t.
func (t *Table[H]) SplitWith(split func(path string) ([]string, bool)) *Table[H] {
	t.split = split
	return t
}

type row[H any] struct {
	Route[H]
	kind   kind
	segs   []string // segments of a {name} pattern
	prefix string   // literal prefix of a {name...} pattern
}

type kind uint8

const (
	fixed kind = iota
	segments
	subtree
)

// New returns a table of routes; it panics on a malformed pattern (the
// tables are literals of the program).
func New[H any](routes ...Route[H]) *Table[H] {
	t := &Table[H]{rows: make([]row[H], 0, len(routes))}
	for i, r := range routes {
		w := parse(r)
		t.rows = append(t.rows, w)
		switch w.kind {
		case fixed:
			for len(t.byLen) <= len(w.Pattern) {
				t.byLen = append(t.byLen, nil)
			}
			t.byLen[len(w.Pattern)] = append(t.byLen[len(w.Pattern)], i)
		case subtree:
			t.subtrees = append(t.subtrees, i)
		}
	}
	return t
}

func parse[H any](r Route[H]) row[H] {
	if !strings.HasPrefix(r.Pattern, "/") {
		panic(fmt.Sprintf("route: pattern %q does not start with /", r.Pattern))
	}
	w := row[H]{Route: r}
	open := strings.IndexByte(r.Pattern, '{')
	switch {
	case open < 0 && !strings.Contains(r.Pattern, "}"):
		w.kind = fixed
	case strings.HasSuffix(r.Pattern, "...}") && strings.Count(r.Pattern, "{") == 1 && r.Pattern[open-1] == '/':
		w.kind, w.prefix = subtree, r.Pattern[:open]
	default:
		w.kind = segments
		w.segs = strings.Split(strings.Trim(r.Pattern, "/"), "/")
		for _, s := range w.segs {
			if s == "" || strings.Contains(s, "...") || (strings.ContainsAny(s, "{}") && (s[0] != '{' || s[len(s)-1] != '}')) {
				panic(fmt.Sprintf("route: pattern %q: segment %q is neither a literal nor a {name}", r.Pattern, s))
			}
		}
	}
	return w
}

// Infos lists the table's rows without their handlers, each pattern
// behind prefix (the table's mount point).
func (t *Table[H]) Infos(prefix string) []Info {
	out := make([]Info, 0, len(t.rows))
	for _, r := range t.rows {
		out = append(out, Info{Method: r.Method, Pattern: prefix + r.Pattern, Auth: r.Auth})
	}
	return out
}

// Result is what Match found.
type Result[H any] struct {
	// Route is the row that serves the request; nil when none does.
	Route *Route[H]
	// Params are the row's parameters in pattern order: {name} segments,
	// or the rest of the path for {name...}.
	Params []string
	// PathKnown is set when no row serves the method but a row serves the
	// path by another (the surface may answer 405), or with Route.
	PathKnown bool
	// Invalid is set when the table's Split refused the path before a
	// {name} row could be tried.
	Invalid bool
}

// Match finds the row serving method on path, appending the parameters to
// params (give a small array's slice to match without allocating).
// Fixed rows and subtrees are tried on the path as given; the path is
// split only when a {name} row is reached.
func (t *Table[H]) Match(method, path string, params []string) Result[H] {
	var res Result[H]
	var segs []string
	split := false
	for i := range t.rows {
		r := &t.rows[i]
		var ok, pathOK bool
		var ps []string
		switch r.kind {
		case fixed:
			ok = path == r.Pattern
			pathOK = ok || (strings.Trim(path, "/") == strings.Trim(r.Pattern, "/"))
		case subtree:
			ok = strings.HasPrefix(path, r.prefix)
			pathOK = ok
			if ok {
				ps = append(params, path[len(r.prefix):])
			}
		case segments:
			if !split {
				split = true
				var valid bool
				if segs, valid = t.segments(path); !valid {
					res.Invalid = true
					return res
				}
			}
			ps, ok = r.match(segs, params)
			pathOK = ok
		}
		if pathOK && !ok {
			res.PathKnown = true
			continue
		}
		if !ok {
			continue
		}
		if !t.serves(r.Method, method) {
			res.PathKnown = true
			continue
		}
		res.Route, res.Params, res.PathKnown = &r.Route, ps, true
		return res
	}
	return res
}

func (t *Table[H]) segments(path string) ([]string, bool) {
	if t.split != nil {
		return t.split(path)
	}
	return strings.Split(strings.Trim(path, "/"), "/"), true
}

func (r *row[H]) match(segs, params []string) ([]string, bool) {
	if len(segs) != len(r.segs) {
		return nil, false
	}
	for i, p := range r.segs {
		if p[0] != '{' && p != segs[i] {
			return nil, false
		}
	}
	for i, p := range r.segs {
		if p[0] == '{' {
			params = append(params, segs[i])
		}
	}
	return params, true
}

// Lookup returns the first fixed row whose pattern is path, else the first
// subtree whose prefix starts path, whatever the method (the caller checks
// it: Serves), or nil; it does not allocate (the gateway's hot path).
func (t *Table[H]) Lookup(path []byte) *Route[H] {
	if len(path) < len(t.byLen) {
		for _, i := range t.byLen[len(path)] {
			if r := &t.rows[i]; r.Pattern == string(path) {
				return &r.Route
			}
		}
	}
	for _, i := range t.subtrees {
		r := &t.rows[i]
		if len(path) >= len(r.prefix) && string(path[:len(r.prefix)]) == r.prefix {
			return &r.Route
		}
	}
	return nil
}

// Serves reports whether the route r (a row of t) serves method m.
func (t *Table[H]) Serves(r *Route[H], m []byte) bool {
	return t.serves(r.Method, string(m))
}

func (t *Table[H]) serves(method, m string) bool {
	return method == "" || method == m || (t.getServesHead && method == "GET" && m == "HEAD")
}

// Handler is a row's handler on the control-plane surfaces: it gets the
// surface's server, the request and the row's parameters (Result.Params).
type Handler[S any] func(s S, ctx *fasthttp.RequestCtx, params []string)

// Plain is the Handler of f, a handler of a row without parameters.
func Plain[S any](f func(S, *fasthttp.RequestCtx)) Handler[S] {
	return func(s S, ctx *fasthttp.RequestCtx, _ []string) { f(s, ctx) }
}

// OneParam is the Handler of f, a handler of a row's first parameter.
func OneParam[S any](f func(S, *fasthttp.RequestCtx, string)) Handler[S] {
	return func(s S, ctx *fasthttp.RequestCtx, params []string) { f(s, ctx, params[0]) }
}

// String describes what Match found, for tests: "METHOD pattern params..."
// (the method "" when the row leaves it to its handler), or "405" when the
// path is served by other methods only, or "404".
func (m Result[H]) String() string {
	switch {
	case m.Route != nil:
		return strings.Join(append([]string{m.Route.Method + " " + m.Route.Pattern}, m.Params...), " ")
	case m.PathKnown:
		return "405"
	}
	return "404"
}
