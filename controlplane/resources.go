package controlplane

import (
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"
)

// postResources publishes a new version: {"resources": {name: value}} or the
// map of named resources itself.
func (s *Server) postResources(ctx *fasthttp.RequestCtx) {
	if !s.needQueue(ctx) {
		return
	}
	var in map[string]json.RawMessage
	if err := strictJSON(string(ctx.PostBody()), &in); err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body (want an object of named resources): "+err.Error())
		return
	}
	if r, ok := in["resources"]; ok && len(in) == 1 {
		in = nil
		if err := json.Unmarshal(r, &in); err != nil {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, `"resources" must be an object of named resources`)
			return
		}
	}
	if len(in) == 0 {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "no resources given")
		return
	}
	c, cancel := s.storeCtx()
	defer cancel()
	r, err := s.queue.Load().PutResources(c, in)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, r)
}

func (s *Server) getResources(ctx *fasthttp.RequestCtx, which string) {
	if !s.needQueue(ctx) {
		return
	}
	var version int64
	if which != "latest" {
		v, err := strconv.ParseInt(which, 10, 64)
		if err != nil || v <= 0 {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "resources version must be a positive integer or \"latest\"")
			return
		}
		version = v
	}
	c, cancel := s.storeCtx()
	defer cancel()
	r, err := s.queue.Load().GetResources(c, version)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	// A version never changes once published: runners may cache it.
	if version != 0 {
		ctx.Response.Header.Set("Cache-Control", "public, max-age=31536000, immutable")
	}
	ctx.Response.Header.Set("ETag", strconv.Quote(strconv.FormatInt(r.Version, 10)))
	writeJSON(ctx, fasthttp.StatusOK, r)
}
