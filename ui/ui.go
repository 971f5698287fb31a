// Package ui serves rollgate's read-only trajectory viewer at /ui: the
// rollouts captured in a store (list, filters, live refresh), a GRPO group
// side by side with the trainer bridge's scores, advantages and exclusions,
// the training curves (reward, calls, tokens, verified ids and exclusions
// per policy version and per group, drawn as server-rendered SVG),
// one rollout's calls as a conversation with rewards and trajectory-merge
// breaks, and one call's prompt and response as tokens shaded by logprob.
//
// Pages are rendered on the server with html/template (captured text is
// hostile input: everything is escaped) from embedded assets; the page's
// only script refreshes the rollout list from the same origin, and a
// Content-Security-Policy forbids any other network access. The viewer
// reads through export.Store, so it works on the embedded store and on
// ClickHouse alike, and it reads trainer-bridge for the group view: it sits
// at the end of rollgate's flow and nothing imports it but cmd/.
package ui

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/route"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

//go:embed assets
var assets embed.FS

// viewerRoute is a row of the viewer's route table.
type viewerRoute = route.Route[route.Handler[*Server]]

// routes are the viewer's pages, each GET (and HEAD); the tokens and raw
// pages take ?attempt= and ?choice=, the list its filters. The fixed pages
// and the static files match the path as sent (/ui/ is /ui); the others
// its segments unescaped once each (segments). docs/contract.md lists them
// (docs/docs_test.go reads Routes).
var routes = route.New(
	viewerRoute{Method: "GET", Pattern: "/ui", Auth: route.Admin, Handler: route.Plain((*Server).serveList)},
	viewerRoute{Method: "GET", Pattern: "/ui/rollouts", Auth: route.Admin, Handler: route.Plain((*Server).serveList)},
	viewerRoute{Method: "GET", Pattern: "/ui/training", Auth: route.Admin, Handler: route.Plain((*Server).serveTraining)},
	viewerRoute{Method: "GET", Pattern: "/ui/static/{file...}", Auth: route.Admin, Handler: route.OneParam((*Server).serveStatic)},
	viewerRoute{Method: "GET", Pattern: "/ui/rollouts/{rollout_id}", Auth: route.Admin,
		Handler: func(s *Server, ctx *fasthttp.RequestCtx, ids []string) { s.serveRollout(ctx, rolloutParam(ids[0])) }},
	viewerRoute{Method: "GET", Pattern: "/ui/rollouts/{rollout_id}/calls/{sequence_id}", Auth: route.Admin,
		Handler: func(s *Server, ctx *fasthttp.RequestCtx, ids []string) {
			s.serveTokens(ctx, rolloutParam(ids[0]), ids[1])
		}},
	viewerRoute{Method: "GET", Pattern: "/ui/rollouts/{rollout_id}/calls/{sequence_id}/raw", Auth: route.Admin,
		Handler: func(s *Server, ctx *fasthttp.RequestCtx, ids []string) { s.serveRaw(ctx, rolloutParam(ids[0]), ids[1]) }},
	viewerRoute{Method: "GET", Pattern: "/ui/groups/{group_id}", Auth: route.Admin, Handler: route.OneParam((*Server).serveGroup)},
).HeadAsGet().SplitWith(segments)

// Routes lists the viewer's pages (docs/docs_test.go checks them against
// docs/contract.md).
func Routes() []route.Info { return routes.Infos("") }

// rolloutParam is the rollout id of a page's path: Unattributed names the
// calls captured without a rollout ("").
func rolloutParam(id string) string {
	if id == Unattributed {
		return ""
	}
	return id
}

// segments splits a path under /ui/ for the table: "ui", then the
// segments after /ui unescaped (splitPath); false when one does not
// unescape or is empty.
func segments(path string) ([]string, bool) {
	parts := splitPath(strings.TrimPrefix(path, "/ui"))
	return append([]string{"ui"}, parts...), parts != nil
}

// Config configures the viewer.
type Config struct {
	// AdminToken, when set, is required as "Authorization: Bearer ..." or
	// as the password of HTTP Basic authentication (any user name), which
	// browsers ask for themselves.
	AdminToken string
	// Decoder turns token ids into text for the tokens view; nil shows the
	// ids alone.
	Decoder Decoder
	// PageSize is the number of rollouts per list page (0: 50).
	PageSize int
	// QueryTimeout bounds each page's store queries (0: 10 s).
	QueryTimeout time.Duration
	// Logger receives store errors (nil: slog.Default()).
	Logger *slog.Logger
}

// Server serves the viewer's pages. Mount Handle on every path under /ui.
type Server struct {
	cfg   Config
	store export.Store
	pages map[string]*template.Template
	log   *slog.Logger
	air   *air.Engine // the rollout view's AIR rules: the bridge's defaults
}

// New returns a viewer of store.
func New(store export.Store, cfg Config) (*Server, error) {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, store: store, log: cfg.Logger}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s.pages = pages
	if s.air, err = air.New(air.DefaultConfig()); err != nil {
		return nil, fmt.Errorf("ui: AIR rules: %w", err)
	}
	return s, nil
}

// Handle answers a request whose path starts with /ui.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	setPageHeaders(h)
	if !s.authorized(ctx) {
		h.Set("WWW-Authenticate", `Basic realm="rollgate", charset="UTF-8"`)
		s.fail(ctx, fasthttp.StatusUnauthorized, "This viewer needs the gateway's admin token: give it as the password (any user name), or as Authorization: Bearer.")
		return
	}
	if !ctx.IsGet() && !ctx.IsHead() {
		h.Set("Allow", "GET, HEAD")
		s.fail(ctx, fasthttp.StatusMethodNotAllowed, "The viewer is read-only: only GET and HEAD are served.")
		return
	}
	// Route on the path as sent, unescaped once per segment below (Path()
	// is unescaped already: a second unescape would turn "a%2541" into
	// "aA"). A path that only reaches /ui once normalised ("/x/../ui")
	// is no viewer page.
	path := string(ctx.URI().PathOriginal())
	if path != "/ui" && !strings.HasPrefix(path, "/ui/") {
		s.fail(ctx, fasthttp.StatusNotFound, "No such page: ask for /ui and the paths under it as they are linked.")
		return
	}
	if path == "/ui/" {
		path = "/ui"
	}
	var ids [2]string
	m := routes.Match(string(ctx.Method()), path, ids[:0])
	switch {
	case m.Route != nil:
		m.Route.Handler(s, ctx, m.Params)
	case m.Invalid:
		s.fail(ctx, fasthttp.StatusNotFound, "No such page: the path is not a valid URL path.")
	default:
		s.fail(ctx, fasthttp.StatusNotFound, "No such page. The viewer has /ui (rollouts), /ui/rollouts/{id}, /ui/rollouts/{id}/calls/{sequence_id}, /ui/groups/{group_id} and /ui/training.")
	}
}

// Refuse answers a request the gateway refused before the viewer saw it
// (gateway.Refuser: a cross-site request, a foreign Host) with the viewer's
// error page and headers.
func (s *Server) Refuse(ctx *fasthttp.RequestCtx, status int, msg string) {
	setPageHeaders(&ctx.Response.Header)
	s.fail(ctx, status, msg)
}

// setPageHeaders sets the headers of every answer of the viewer: a CSP that
// allows nothing but its own assets and no framing, no sniffing, no
// referrer, no caching.
func setPageHeaders(h *fasthttp.ResponseHeader) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// splitPath splits an escaped path after /ui into its unescaped segments,
// or returns nil when a segment does not unescape or is empty.
func splitPath(p string) []string {
	raw := strings.Split(strings.Trim(p, "/"), "/")
	out := make([]string, len(raw))
	for i, r := range raw {
		u, err := url.PathUnescape(r)
		if err != nil || u == "" {
			return nil
		}
		out[i] = u
	}
	return out
}

// authorized checks the admin token, when one is set.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.AdminToken == "" {
		return true
	}
	auth := string(ctx.Request.Header.Peek("Authorization"))
	var got string
	switch {
	case strings.HasPrefix(auth, "Bearer "):
		got = strings.TrimPrefix(auth, "Bearer ")
	case strings.HasPrefix(auth, "Basic "):
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic "))
		if err != nil {
			return false
		}
		_, pass, ok := strings.Cut(string(raw), ":")
		if !ok {
			return false
		}
		got = pass
	default:
		return false
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.AdminToken)) == 1
}

// serveStatic serves the stylesheet and the script.
func (s *Server) serveStatic(ctx *fasthttp.RequestCtx, name string) {
	var ctype string
	switch name {
	case "ui.css":
		ctype = "text/css; charset=utf-8"
	case "ui.js":
		ctype = "text/javascript; charset=utf-8"
	default:
		s.fail(ctx, fasthttp.StatusNotFound, "No such file.")
		return
	}
	b, err := assets.ReadFile("assets/" + name)
	if err != nil {
		s.fail(ctx, fasthttp.StatusNotFound, "No such file.")
		return
	}
	ctx.Response.Header.Set("Cache-Control", "max-age=300")
	ctx.SetContentType(ctype)
	ctx.SetBody(b)
}

// queryCtx bounds a page's store queries.
func (s *Server) queryCtx(ctx *fasthttp.RequestCtx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.QueryTimeout)
}

// storeFailed answers a store error: 503 with the error logged, not shown
// (it may name the store's address).
func (s *Server) storeFailed(ctx *fasthttp.RequestCtx, what string, err error) {
	s.log.Warn("ui: store query failed", "page", what, "err", err)
	s.fail(ctx, fasthttp.StatusServiceUnavailable, "The store did not answer ("+what+"); the gateway's log has the error. Try again.")
}
