package gateway

import (
	"errors"
	"io"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// messagesChatPath is the engine route a Messages call is sent to.
var messagesChatPath = []byte("/v1/chat/completions")

// messages serves POST /v1/messages (Anthropic's Messages API, with the same
// path and header attribution as chat): the request is translated to a chat
// completion (messagesToChat), proxied and captured as one (the row's
// endpoint is /v1/messages, its bodies the chat exchange with the engine,
// its ids and logprobs the engine's), and the answer is translated back:
// a message, or Anthropic's stream events (messagesStream). Every error,
// the gateway's own and the engine's, reaches the client in Anthropic's
// shape: {"type":"error","error":{"type":…,"message":…}}.
func (s *Server) messages(ctx *fasthttp.RequestCtx, attr attribution) {
	if !ctx.IsPost() {
		anthropicError(ctx, fasthttp.StatusMethodNotAllowed, "method "+string(ctx.Method())+" not allowed on /v1/messages: use POST")
		return
	}
	// The Anthropic SDK sends its key as x-api-key: it is the client key
	// (Authorization wins), and is never forwarded to the engine.
	h := &ctx.Request.Header
	if k := h.Peek("x-api-key"); len(k) > 0 && len(h.Peek("Authorization")) == 0 {
		h.Set("Authorization", "Bearer "+string(k))
	}
	h.Del("x-api-key")
	body := ctx.PostBody()
	if _, err := rewrite.Inspect(body); err != nil {
		msg := "request body: must be one JSON object (an Anthropic Messages request)"
		if errors.Is(err, jsonscan.ErrTooDeep) {
			msg = "request body: " + err.Error()
		}
		anthropicError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	chat, stream, err := messagesToChat(body)
	if err != nil {
		anthropicError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	ctx.Request.SetBody(chat)
	h.SetContentType("application/json") // what is sent is the translation, JSON whatever the client said
	opts := callOptions{force: s.forceFor(ctx, attr), endpoint: openai.Messages}
	if stream {
		opts.wrapStream = func(r io.Reader) io.Reader { return newMessagesStream(r) }
	}
	s.proxyWith(ctx, attr, openai.ChatCompletions, messagesChatPath, opts)

	status := ctx.Response.StatusCode()
	if ctx.Response.IsBodyStream() || ctx.Hijacked() {
		return // an event stream (translated), or a hijacked answer
	}
	if status >= 300 {
		anthropicError(ctx, status, errorMessageOf(ctx.Response.Body()))
		return
	}
	msg, err := chatToMessage(ctx.Response.Body())
	if err != nil {
		anthropicError(ctx, fasthttp.StatusBadGateway, "the engine's answer could not be turned into a message: "+err.Error())
		return
	}
	ctx.Response.SetBody(msg)
}

// anthropicError answers status with an Anthropic-style error body.
func anthropicError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.Response.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.SetBody(appendAnthropicError(nil, anthropicErrorType(status), msg))
}
