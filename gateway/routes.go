package gateway

import (
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/internal/route"
)

// agentRoute is what a row of the gateway's route table does.
type agentRoute struct {
	// ep is a model route's endpoint (openai.Unknown for the others).
	ep openai.Endpoint
	// serve answers the request; it returns false when the route's
	// surface is not set up (no control plane, no viewer), and the request
	// goes on to the mounted surfaces (Mount).
	serve func(s *Server, ctx *fasthttp.RequestCtx, attr attribution, path []byte, ep openai.Endpoint) bool
}

// model is the row of a model route: proxied to a backend and captured.
func model(ep openai.Endpoint) agentRoute { return agentRoute{ep: ep, serve: (*Server).serveModel} }

// agentRow is a row of the gateway's route table.
type agentRow = route.Route[agentRoute]

// agentRoutes are the routes the gateway serves itself, matched on the path
// that follows the /rollout/{rollout_id}/attempt/{attempt_id} prefix when
// there is one (attributionOf). A fixed path is served whatever the method
// it is asked with: a method other than the row's is answered 405 (with
// Allow on GET rows, which serve HEAD too: HeadAsGet); a path no row serves goes to
// the mounted surfaces (Mount), then 404 (unknownRouteMessage). The
// ClientKey rows check the key themselves (the proxy path, models,
// ServeTraces); the Admin subtrees are guarded against cross-site requests
// here when no admin token is set, and check the token themselves.
var agentRoutes = route.New(
	agentRow{Method: "POST", Pattern: "/v1/chat/completions", Auth: route.ClientKey, Handler: model(openai.ChatCompletions)},
	agentRow{Method: "POST", Pattern: "/v1/completions", Auth: route.ClientKey, Handler: model(openai.Completions)},
	agentRow{Method: "POST", Pattern: "/v1/responses", Auth: route.ClientKey, Handler: model(openai.Responses)},
	agentRow{Method: "POST", Pattern: "/v1/embeddings", Auth: route.ClientKey, Handler: model(openai.Embeddings)},
	agentRow{Pattern: "/v1/messages", Auth: route.ClientKey, Handler: agentRoute{serve: (*Server).serveMessages}},
	agentRow{Pattern: "/v1/models", Auth: route.ClientKey, Handler: agentRoute{serve: (*Server).serveModels}},
	agentRow{Pattern: "/v1/traces", Auth: route.ClientKey, Handler: agentRoute{serve: (*Server).serveTraces}},
	agentRow{Method: "GET", Pattern: "/metrics", Auth: route.Open, Handler: agentRoute{serve: (*Server).serveMetrics}},
	agentRow{Method: "GET", Pattern: "/healthz", Auth: route.Open, Handler: agentRoute{serve: (*Server).serveHealthz}},
	agentRow{Method: "GET", Pattern: "/readyz", Auth: route.Open, Handler: agentRoute{serve: (*Server).serveReadyz}},
	agentRow{Pattern: "/api/v1/{path...}", Auth: route.Admin, Handler: agentRoute{serve: (*Server).serveAPI}},
	agentRow{Pattern: "/ui", Auth: route.Admin, Handler: agentRoute{serve: (*Server).serveUI}},
	agentRow{Pattern: "/ui/{path...}", Auth: route.Admin, Handler: agentRoute{serve: (*Server).serveUI}},
).HeadAsGet()

// Routes lists the gateway's own routes (docs/docs_test.go checks them
// against docs/contract.md); the /api/v1 and /ui subtrees list theirs in
// controlplane.Routes and ui.Routes, the mounted Agent Lightning surface in
// agl.Routes.
func Routes() []route.Info { return agentRoutes.Infos("") }

// routeOf maps a path (without rollout prefix) to the LLM endpoint it
// names exactly, or openai.Unknown.
func routeOf(path []byte) openai.Endpoint {
	if r := agentRoutes.Lookup(path); r != nil {
		return r.Handler.ep
	}
	return openai.Unknown
}

// route answers a request by the route table (Handle).
func (s *Server) route(ctx *fasthttp.RequestCtx, attr attribution, path []byte) {
	if r := agentRoutes.Lookup(path); r != nil {
		if !agentRoutes.Serves(r, ctx.Method()) {
			s.wrongMethod(ctx, r.Method, path)
			return
		}
		if r.Handler.serve(s, ctx, attr, path, r.Handler.ep) {
			return
		}
	}
	if s.serveMounted(ctx, path) {
		return
	}
	s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, unknownRouteMessage(ctx.Method(), ctx.Path()))
}

// wrongMethod answers 405 to a method the route at path does not serve:
// the read-only routes (GET) name GET and HEAD in Allow.
func (s *Server) wrongMethod(ctx *fasthttp.RequestCtx, method string, path []byte) {
	if method == "GET" {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
	}
	s.plainError(ctx, fasthttp.StatusMethodNotAllowed, errInvalidRequest, "method "+string(ctx.Method())+" not allowed on "+string(path)+": use "+method)
}

func (s *Server) serveModel(ctx *fasthttp.RequestCtx, attr attribution, path []byte, ep openai.Endpoint) bool {
	s.proxy(ctx, attr, ep, path)
	return true
}

// serveMessages answers Anthropic's Messages API (messages.go), its own
// 405 in Anthropic's error shape included.
func (s *Server) serveMessages(ctx *fasthttp.RequestCtx, attr attribution, _ []byte, _ openai.Endpoint) bool {
	s.messages(ctx, attr)
	return true
}

func (s *Server) serveModels(ctx *fasthttp.RequestCtx, _ attribution, _ []byte, _ openai.Endpoint) bool {
	s.models(ctx)
	return true
}

// serveTraces hands OTLP ingest to the control plane, attributed by the
// rollout prefix or the x-rollout-id header.
func (s *Server) serveTraces(ctx *fasthttp.RequestCtx, attr attribution, _ []byte, _ openai.Endpoint) bool {
	if msg := attributionError(attr, attr.fromPath); msg != "" {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, msg)
		return true
	}
	if s.control == nil {
		return false
	}
	s.control.ServeTraces(ctx, string(attr.rolloutID), string(attr.attemptID))
	return true
}

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx, _ attribution, _ []byte, _ openai.Endpoint) bool {
	s.metricsHandler(ctx)
	return true
}

func (s *Server) serveHealthz(ctx *fasthttp.RequestCtx, _ attribution, _ []byte, _ openai.Endpoint) bool {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"status":"ok"}`)
	return true
}

func (s *Server) serveReadyz(ctx *fasthttp.RequestCtx, _ attribution, _ []byte, _ openai.Endpoint) bool {
	s.readyz(ctx)
	return true
}

// serveAPI hands /api/v1/... to the control plane (which checks the admin
// token), once guarded: every route without a credential is guarded here,
// before its surface reads the request (crosssite.go).
func (s *Server) serveAPI(ctx *fasthttp.RequestCtx, _ attribution, path []byte, _ openai.Endpoint) bool {
	if s.control == nil {
		return false
	}
	if !s.guarded(ctx, surface{open: s.cfg.AdminToken == ""}) {
		s.control.ServeAPI(ctx, string(path[len("/api/v1"):]))
	}
	return true
}

// serveUI hands /ui and the paths under it to the viewer (which checks the
// admin token), once guarded as pages (crosssite.go).
func (s *Server) serveUI(ctx *fasthttp.RequestCtx, _ attribution, _ []byte, _ openai.Endpoint) bool {
	if s.ui == nil {
		return false
	}
	if !s.guarded(ctx, surface{open: s.cfg.AdminToken == "", navigable: true, refuse: s.uiRefuse}) {
		s.ui(ctx)
	}
	return true
}
