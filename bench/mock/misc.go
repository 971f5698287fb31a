package mock

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Embeddings (POST /v1/embeddings): one deterministic unit vector of Config.EmbeddingDim
// floats per input (a function of the model and the input's token ids), encoding_format
// "float" (default) or "base64" (little-endian float32).
func (s *Server) embeddings(ctx *fasthttp.RequestCtx) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, &knobs{})
	defer p.release()
	msg := f.err
	if msg == "" {
		msg = p.readPrompts(f.input, "input")
	}
	b64 := false
	if msg == "" {
		switch ef := f.encodingFormat; {
		case !ef.Exists() || ef.Type == gjson.Null || ef.Str == "float":
		case ef.Str == "base64":
			b64 = true
		default:
			msg = "encoding_format: Input should be 'float' or 'base64'"
		}
	}
	if msg == "" {
		for i := 0; i < p.numPrompts(); i++ {
			if msg = p.checkContext(len(p.prompt(i)), unset); msg != "" {
				break
			}
		}
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.setModel(&f)
	h := newHasher()
	h.str(b2s(p.model))
	h.ids(p.prompts)
	h.u64(uint64(p.numPrompts()))
	p.setID(h)

	b := append(p.buf[:0], `{"id":"embd-`...)
	b = append(b, p.id[:]...)
	b = append(b, `","object":"list","created":`...)
	b = strconv.AppendInt(b, s.cfg.Created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, b2s(p.model))
	b = append(b, `,"data":[`...)
	vec := make([]float32, s.cfg.EmbeddingDim)
	for i := 0; i < p.numPrompts(); i++ {
		eh := newHasher()
		eh.u64(s.cfg.Seed)
		eh.str(b2s(p.model))
		eh.ids(p.prompt(i))
		embedding(vec, eh.sum())
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"object":"embedding","embedding":`...)
		if b64 {
			p.text = p.text[:0]
			for _, v := range vec {
				p.text = binary.LittleEndian.AppendUint32(p.text, math.Float32bits(v))
			}
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, p.text)
			b = append(b, '"')
		} else {
			b = append(b, '[')
			for j, v := range vec {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendFloat32(b, v)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	b = append(b, `],"usage":`...)
	b = appendUsage(b, len(p.prompts), 0)
	p.buf = append(b, '}')
	writeJSON(ctx, p.buf)
}

// tokenize serves POST /tokenize in its prompt form ({"prompt"}) and chat form
// ({"messages","tools","add_generation_prompt"}); the chat form gives exactly the
// prompt_token_ids of the chat route for the same messages and tools.
func (s *Server) tokenize(ctx *fasthttp.RequestCtx) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, &knobs{})
	defer p.release()
	switch s.cfg.Flavor {
	case FlavorSGLang:
		s.sglangTokenize(ctx, &f, p)
		return
	case FlavorLlamaCpp:
		s.llamaCppTokenize(ctx, &f, p)
		return
	}
	msg := f.err
	switch {
	case msg != "":
	case f.messages.Exists() && f.messages.Type != gjson.Null:
		if !f.messages.IsArray() {
			msg = "messages: Input should be a valid list"
			break
		}
		if p.text, msg = s.v.renderChat(p.text[:0], &f); msg == "" {
			p.prompts = s.v.encode(p.prompts, b2s(p.text))
		}
	case f.prompt.Type == gjson.String:
		p.prompts = s.v.encode(p.prompts, f.prompt.Str)
	case !f.prompt.Exists() || f.prompt.Type == gjson.Null:
		msg = "prompt: Field required (or messages, for the chat form)"
	default:
		msg = "prompt: Input should be a valid string"
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	b := append(p.buf[:0], `{"count":`...)
	b = strconv.AppendInt(b, int64(len(p.prompts)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.cfg.MaxModelLen), 10)
	b = append(b, `,"tokens":`...)
	b = appendIDs(b, p.prompts)
	b = append(b, `,"token_strs":`...)
	if f.tokenStrs {
		b = append(b, '[')
		for i, id := range p.prompts {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s.v.pieces[id])
		}
		b = append(b, ']')
	} else {
		b = append(b, "null"...)
	}
	p.buf = append(b, '}')
	writeJSON(ctx, p.buf)
}

// detokenize serves POST /detokenize: {"tokens":[...]} -> {"prompt":"..."} (vLLM),
// {"text":"..."} (SGLang) or {"content":"..."} (llama.cpp).
func (s *Server) detokenize(ctx *fasthttp.RequestCtx) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, &knobs{})
	defer p.release()
	msg := f.err
	if msg == "" {
		if !f.tokens.Exists() || f.tokens.Type == gjson.Null {
			msg = "tokens: Field required"
		} else if ids, ok := tokenIDList(p.prompts, f.tokens, s.v.size()); !ok {
			msg = "tokens: Input should be a list of token ids below " + strconv.Itoa(s.v.size())
		} else {
			p.prompts = ids
		}
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.text = s.v.decode(p.text[:0], p.prompts)
	var b []byte
	switch s.cfg.Flavor {
	case FlavorSGLang:
		b = append(p.buf[:0], `{"text":`...)
	case FlavorLlamaCpp:
		b = append(p.buf[:0], `{"content":`...)
	default:
		b = append(p.buf[:0], `{"prompt":`...)
	}
	b = appendJSONString(b, b2s(p.text))
	p.buf = append(b, '}')
	writeJSON(ctx, p.buf)
}
