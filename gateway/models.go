package gateway

import (
	"encoding/json"
	"time"

	"github.com/valyala/fasthttp"
)

// models answers GET /v1/models in OpenAI list format: the routed model names,
// plus, for a wildcard route, the models its first replica lists.
func (s *Server) models(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		s.plainError(ctx, fasthttp.StatusMethodNotAllowed, errInvalidRequest, "use GET /v1/models")
		return
	}
	if _, ok := s.clientKeyName(ctx); !ok {
		s.plainError(ctx, fasthttp.StatusUnauthorized, "invalid_request_error", "Incorrect API key provided")
		return
	}
	t := s.backends.Load()
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	seen := map[string]bool{}
	for _, name := range t.Models() {
		seen[name] = true
		out.Data = append(out.Data, model{ID: name, Object: "model", OwnedBy: "rollgate"})
	}
	if w := t.Wildcard(); w != nil {
		r := w.Replicas()[0]
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI(r.Origin() + r.BasePath() + "/models")
		req.Header.SetMethod(fasthttp.MethodGet)
		if auth := r.Auth(); auth != "" {
			req.Header.Set("Authorization", auth)
		} else if a := ctx.Request.Header.Peek("Authorization"); len(a) > 0 && s.cfg.ForwardClientAuthorization {
			req.Header.SetBytesV("Authorization", a)
		}
		if err := r.Client().DoTimeout(req, resp, 10*time.Second); err == nil && resp.StatusCode() == 200 {
			body, _ := readAll(resp, 8<<20)
			var up struct {
				Data []model `json:"data"`
			}
			if json.Unmarshal(body, &up) == nil {
				for _, m := range up.Data {
					if !seen[m.ID] {
						seen[m.ID] = true
						out.Data = append(out.Data, m)
					}
				}
			}
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBody(appendError(nil, 500, errServer, "encoding response: "+err.Error()))
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
