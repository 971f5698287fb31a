// Package agl serves Agent Lightning v1.0's API gateway surface (its
// `agl-server`: /api/rollouts, /api/models, /proxy/...) on rollgate's
// stores, so that AGL's trainer, controllers and agents work against
// rollgate by changing one URL. See docs/contract.md "Agent Lightning
// surface" for the mapping onto rollgate's rollouts and task queue, and
// shared design AGL.md for the surface itself.
//
// Rollouts are rows of the task queue (controlplane/tasks); non-model
// events are the queue's events; model_request events are the captured
// llm_calls rows of (rollout, attempt), built on read, and reward events
// also land in the rewards table. The model proxy route is served by the
// gateway's own proxy path (gateway.Server.ProxyAgent): attribution,
// sequence ids, rollout-affine routing, retries, streaming and capture.
//
// Errors on these routes are FastAPI's: {"detail": "..."}, and 422 with a
// list of {type, loc, msg, input} for a body or query that does not
// validate.
package agl

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/route"
)

// Gateway is what this surface needs of the gateway (*gateway.Server).
type Gateway interface {
	// Backends is the operator's routing table (its replica hosts are
	// allowed endpoints by default); this surface never changes it.
	Backends() gateway.BackendsView
	// NewMountedBackends makes the surface's own routing table: the models
	// registered with POST /api/models, served on its proxy route only.
	NewMountedBackends() (*backends.Set, error)
	// ProxyAgent serves a model call through the gateway's proxy path.
	ProxyAgent(ctx *fasthttp.RequestCtx, ac gateway.AgentCall)
	// RegisterRollout records a rollout's task id for its captured calls.
	RegisterRollout(rolloutID, taskID string)
	// Mount serves a path prefix with a handler, guarded as o says.
	Mount(prefix string, h fasthttp.RequestHandler, o gateway.MountOptions)
}

var _ Gateway = (*gateway.Server)(nil)

// Deps are the stores this surface reads and writes.
type Deps struct {
	// Queue holds the rollouts and their non-model events (required).
	Queue *tasks.Queue
	// Store holds llm_calls and rewards (required).
	Store export.Store
	// Capture, when set, is synced before model_request events are read, so
	// that a call answered before the read is in them.
	Capture *capture.Pipeline
	// Mirror, when set, mirrors rollout state changes to the rollouts table
	// (controlplane.Server.MirrorChanges).
	Mirror func(context.Context, []tasks.Change)
	// Log defaults to slog.Default().
	Log *slog.Logger
}

// Server serves the Agent Lightning surface.
type Server struct {
	cfg   Config
	force *forceSets
	allow *allowList
	gw    Gateway
	d     Deps
	log   *slog.Logger

	mu     sync.Mutex
	models map[string][]aglModel // model name → endpoints, in registration order
	table  *backends.Set         // models as pools: the proxy route's routing table

	pause pauseState
}

// New checks cfg and builds the surface; Mount serves it.
func New(cfg Config, gw Gateway, d Deps) (*Server, error) {
	force, err := cfg.check()
	if err != nil {
		return nil, err
	}
	allow, err := parseAllowList(cfg.AllowedEndpoints)
	if err != nil {
		return nil, fmt.Errorf("%w (agl.allowed_endpoints, --agl-allowed-endpoints)", err)
	}
	allow.operatorReplicas = func() []string { return replicaURLs(gw.Backends()) }
	table, err := gw.NewMountedBackends()
	if err != nil {
		return nil, err
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	cfg.setDefaults()
	if cfg.Key == "" {
		d.Log.Warn("agl: no key set (agl.key / --agl-key): the Agent Lightning routes answer without authentication")
	}
	s := &Server{cfg: cfg, force: force, allow: allow, gw: gw, d: d, log: d.Log, models: map[string][]aglModel{}, table: table}
	s.pause.retryAfter = 5
	if err := s.loadModels(); err != nil {
		return nil, fmt.Errorf("agl: restoring the models registered before the restart: %w", err)
	}
	return s, nil
}

// Mount serves the surface on the gateway: /api/ (below /api/v1, which stays
// rollgate's) and /proxy/. Without a key the surface answers without a
// credential, so the gateway refuses cross-site requests and foreign Hosts
// on it (gateway/crosssite.go), except on the agents' model route
// /proxy/rollout/..., which is agent traffic and serves any Host as the
// gateway's own agent routes do.
func (s *Server) Mount() {
	o := gateway.MountOptions{Open: s.cfg.Key == "", AgentPrefix: "/proxy/rollout/", Refuse: detail,
		Credential: "agl.key (--agl-key, ROLLGATE_AGL_KEY)"}
	s.gw.Mount("/api/", s.Handle, o)
	s.gw.Mount("/proxy/", s.Handle, o)
}

// aglRoute is a row of the surface's route table.
type aglRoute = route.Route[route.Handler[*Server]]

// routes are the surface's routes (mounted on /api/ and /proxy/). A path
// that a row serves by another method is answered 405, any other path 404,
// both FastAPI-style; the model route's subtree answers its own 404 and 405
// (proxy, proxyEndpoints).
var routes = route.New(
	aglRoute{Pattern: "/proxy/rollout/{path...}", Auth: route.AGLKey, Handler: (*Server).proxy},
	aglRoute{Method: "POST", Pattern: "/proxy/pause", Auth: route.AGLKey, Handler: route.Plain((*Server).postPause)},
	aglRoute{Method: "POST", Pattern: "/proxy/resume", Auth: route.AGLKey, Handler: route.Plain((*Server).postResume)},
	aglRoute{Method: "GET", Pattern: "/proxy/state", Auth: route.AGLKey, Handler: route.Plain((*Server).getPauseState)},
	aglRoute{Method: "POST", Pattern: "/api/models", Auth: route.AGLKey, Handler: route.Plain((*Server).postModels)},
	aglRoute{Method: "DELETE", Pattern: "/api/models", Auth: route.AGLKey, Handler: route.Plain((*Server).deleteModels)},
	aglRoute{Method: "POST", Pattern: "/api/rollouts", Auth: route.AGLKey, Handler: route.Plain((*Server).createRollouts)},
	aglRoute{Method: "GET", Pattern: "/api/rollouts", Auth: route.AGLKey, Handler: route.Plain((*Server).listRollouts)},
	aglRoute{Method: "GET", Pattern: "/api/rollouts/terminal", Auth: route.AGLKey, Handler: route.Plain((*Server).terminal)},
	aglRoute{Method: "GET", Pattern: "/api/rollouts/{rollout_id}", Auth: route.AGLKey, Handler: route.OneParam((*Server).getRollout)},
	aglRoute{Method: "PATCH", Pattern: "/api/rollouts/{rollout_id}", Auth: route.AGLKey, Handler: route.OneParam((*Server).patchRollout)},
	aglRoute{Method: "DELETE", Pattern: "/api/rollouts/{rollout_id}", Auth: route.AGLKey, Handler: route.OneParam((*Server).deleteRollout)},
	aglRoute{Method: "GET", Pattern: "/api/rollouts/{rollout_id}/events", Auth: route.AGLKey, Handler: route.OneParam((*Server).getEvents)},
	aglRoute{Method: "POST", Pattern: "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events", Auth: route.AGLKey,
		Handler: func(s *Server, ctx *fasthttp.RequestCtx, ids []string) { s.postEvent(ctx, ids[0], ids[1]) }},
)

// Routes lists the surface's routes (docs/docs_test.go checks them against
// docs/contract.md): the table's, the model route once per endpoint.
func Routes() []route.Info {
	var out []route.Info
	for _, r := range routes.Infos("") {
		if !r.Subtree() {
			out = append(out, r)
		}
	}
	for _, e := range proxyEndpoints {
		out = append(out, route.Info{Method: "POST", Pattern: proxyRoute + e.path, Auth: route.AGLKey})
	}
	return out
}

// Handle serves one request of the surface: AGL's key, then the path's
// ids (validPathIDs), then the route.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	sub := string(ctx.Path())
	if !s.authorized(ctx) {
		return
	}
	if !strings.HasPrefix(sub, "/proxy/rollout/") && !validPathIDs(ctx, strings.Split(strings.Trim(sub, "/"), "/")) {
		return
	}
	var ids [2]string
	m := routes.Match(string(ctx.Method()), sub, ids[:0])
	switch {
	case m.Route != nil:
		m.Route.Handler(s, ctx, m.Params)
	case m.PathKnown:
		detail(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
	default:
		detail(ctx, fasthttp.StatusNotFound, "Not Found")
	}
}

// validPathIDs answers 422 (false) when a rollout or attempt id in a
// /api/rollouts/{rollout_id}[/attempt/{attempt_id}]/... path is outside
// contract section 1.1's charset: no rollout is created with such an id, and
// none is stored under one.
func validPathIDs(ctx *fasthttp.RequestCtx, parts []string) bool {
	if len(parts) < 3 || parts[0] != "api" || parts[1] != "rollouts" {
		return true
	}
	var errs []fieldError
	if !gateway.ValidID([]byte(parts[2])) {
		errs = append(errs, fieldError{Type: "string_pattern_mismatch", Loc: []any{"path", "rollout_id"}, Msg: "rollout_id must be " + gateway.IDCharset, Input: parts[2]})
	}
	if len(parts) >= 5 && parts[3] == "attempt" && !gateway.ValidID([]byte(parts[4])) {
		errs = append(errs, fieldError{Type: "string_pattern_mismatch", Loc: []any{"path", "attempt_id"}, Msg: "attempt_id must be " + gateway.IDCharset, Input: parts[4]})
	}
	if len(errs) > 0 {
		invalid(ctx, errs...)
		return false
	}
	return true
}

// authorized checks AGL's key: Authorization: Bearer KEY or x-api-key: KEY
// (constant-time). 401 {"detail": "Invalid or missing API key"} otherwise.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.Key == "" {
		return true
	}
	key := []byte(s.cfg.Key)
	if got := ctx.Request.Header.Peek("x-api-key"); len(got) > 0 && subtle.ConstantTimeCompare(got, key) == 1 {
		return true
	}
	got := ctx.Request.Header.Peek("Authorization")
	if len(got) > 7 && strings.EqualFold(string(got[:7]), "bearer ") && subtle.ConstantTimeCompare(got[7:], key) == 1 {
		return true
	}
	detail(ctx, fasthttp.StatusUnauthorized, "Invalid or missing API key")
	return false
}

// detail answers a FastAPI-style error: {"detail": msg}.
func detail(ctx *fasthttp.RequestCtx, status int, msg string) {
	writeJSON(ctx, status, map[string]string{"detail": msg})
}

// fieldError is one item of a 422 body (pydantic's error shape).
type fieldError struct {
	Type  string `json:"type"`
	Loc   []any  `json:"loc"`
	Msg   string `json:"msg"`
	Input any    `json:"input"`
}

// invalid answers 422 {"detail": [errors...]}. An input larger than 1 KiB
// is not echoed (pydantic echoes it whole; a hostile body may also nest
// deeper than encoding/json writes).
func invalid(ctx *fasthttp.RequestCtx, errs ...fieldError) {
	for i := range errs {
		if raw, ok := errs[i].Input.(json.RawMessage); ok && len(raw) > 1024 {
			errs[i].Input = nil
		}
	}
	writeJSON(ctx, fasthttp.StatusUnprocessableEntity, map[string]any{"detail": errs})
}

// writeJSON answers v as JSON with status.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = fasthttp.StatusInternalServerError
		b, _ = json.Marshal(map[string]string{"detail": "encoding the response: " + err.Error()})
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// storeError answers for an error of the stores: 503, the cause named.
func (s *Server) storeError(ctx *fasthttp.RequestCtx, what string, err error) {
	s.log.Warn("agl: "+what, "err", err)
	detail(ctx, fasthttp.StatusServiceUnavailable, what+": "+err.Error()+" (the gateway's store or task queue is down or slow; retry)")
}

// storeCtx bounds one request's store work.
func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}
