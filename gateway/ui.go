package gateway

import "github.com/valyala/fasthttp"

// SetUI mounts h on /ui and every path under /ui/ (the trajectory viewer,
// package ui; cmd/rollgate mounts it). Call it before Serve. Without one
// those paths answer 404. Without an admin token the viewer answers
// without a credential, so the gateway refuses cross-site requests and
// foreign Hosts on it (crosssite.go) with refuse, the viewer's error page
// (nil: OpenAI-style).
func (s *Server) SetUI(h fasthttp.RequestHandler, refuse Refuser) { s.ui, s.uiRefuse = h, refuse }
