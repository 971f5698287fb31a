package ui

import (
	"fmt"
	"math"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
)

// tokensPerPage bounds the tokens one page shows per side (prompt, response).
const tokensPerPage = 2000

// tokenView is one token of the tokens page.
type tokenView struct {
	ID      uint32
	Text    string // decoded piece, "" when no decoder
	Class   string // CSS classes
	Title   string // tooltip: id, logprob, probability, why masked
	CutHere bool   // the response is cut before this token
}

// tokensPage is the tokens template's data.
type tokensPage struct {
	RolloutID, Attempt string
	Call               export.Call
	Decoded            bool
	DecodeNote         string
	Prompt, Response   []tokenView
	PromptLen, RespLen int
	POff, ROff         int
	PNext, RNext       int // offsets of the next page of each side, -1 when none
	MaxResponse        int // the cut point asked for (?max_response), 0: none
	Cut                bool
	Logprobs           bool
}

// serveTokens serves one call's prompt and response as tokens.
func (s *Server) serveTokens(ctx *fasthttp.RequestCtx, rolloutID, seqStr string) {
	c, attempt, ok := s.findCall(ctx, rolloutID, seqStr)
	if !ok {
		return
	}
	a := ctx.QueryArgs()
	p := tokensPage{RolloutID: rolloutID, Attempt: attempt, Call: *c, PromptLen: len(c.PromptTokenIDs), RespLen: len(c.ResponseTokenIDs),
		Logprobs: len(c.ResponseLogprobs) == len(c.ResponseTokenIDs) && len(c.ResponseLogprobs) > 0}
	p.POff = clampOffset(a.GetUintOrZero("poff"), len(c.PromptTokenIDs))
	p.ROff = clampOffset(a.GetUintOrZero("roff"), len(c.ResponseTokenIDs))
	p.MaxResponse = a.GetUintOrZero("max_response")
	pEnd := min(p.POff+tokensPerPage, len(c.PromptTokenIDs))
	rEnd := min(p.ROff+tokensPerPage, len(c.ResponseTokenIDs))
	p.PNext, p.RNext = nextOffset(pEnd, len(c.PromptTokenIDs)), nextOffset(rEnd, len(c.ResponseTokenIDs))
	pids, rids := c.PromptTokenIDs[p.POff:pEnd], c.ResponseTokenIDs[p.ROff:rEnd]

	var pieces map[uint32]string
	if s.cfg.Decoder != nil && len(pids)+len(rids) > 0 {
		qctx, cancel := s.queryCtx(ctx)
		var err error
		pieces, err = decodeUnique(qctx, s.cfg.Decoder, c, pids, rids)
		cancel()
		if err != nil {
			p.DecodeNote = "Token text unavailable (" + err.Error() + "): ids only."
			s.log.Warn("ui: decoding tokens failed", "rollout", rolloutID, "sequence_id", c.SequenceID, "err", err)
		} else {
			p.Decoded = true
		}
	} else if s.cfg.Decoder == nil {
		p.DecodeNote = "No decoder configured (--ui-tokenizer, or a replica that answers /detokenize): ids only."
	}
	prefix := int(c.TurnPrefixLen)
	for i, id := range pids {
		pos := p.POff + i
		t := tokenView{ID: id, Text: pieces[id], Class: "tok masked"}
		if pos >= prefix && c.TurnKind == "prefix" {
			t.Class += " obs"
			t.Title = fmt.Sprintf("prompt #%d, id %d: new observation (masked: not trained)", pos, id)
		} else {
			t.Title = fmt.Sprintf("prompt #%d, id %d: context (masked: not trained)", pos, id)
		}
		p.Prompt = append(p.Prompt, t)
	}
	for i, id := range rids {
		pos := p.ROff + i
		t := tokenView{ID: id, Text: pieces[id], Class: "tok gen"}
		if p.Logprobs {
			lp := c.ResponseLogprobs[pos]
			t.Class += " " + shade(lp)
			t.Title = fmt.Sprintf("response #%d, id %d: logprob %.4f (p = %.3f)", pos, id, lp, math.Exp(float64(lp)))
		} else {
			t.Title = fmt.Sprintf("response #%d, id %d: no logprob captured", pos, id)
		}
		if p.MaxResponse > 0 && pos >= p.MaxResponse {
			t.Class += " cut"
			t.Title += "; beyond the cut (not trained)"
			if pos == p.MaxResponse {
				t.CutHere = true
			}
			p.Cut = true
		}
		p.Response = append(p.Response, t)
	}
	if p.MaxResponse > 0 && p.MaxResponse < len(c.ResponseTokenIDs) {
		p.Cut = true
	}
	s.render(ctx, fasthttp.StatusOK, "tokens", fmt.Sprintf("Call %d of %s", c.SequenceID, rolloutID), p)
}

func clampOffset(off, n int) int {
	if off < 0 || off >= n {
		return 0
	}
	return off
}

func nextOffset(end, n int) int {
	if end >= n {
		return -1
	}
	return end
}

// findCall reads the call a tokens or raw page names (?attempt, ?choice),
// or answers the error page and returns false.
func (s *Server) findCall(ctx *fasthttp.RequestCtx, rolloutID, seqStr string) (*export.Call, string, bool) {
	if err := checkValue("rollout id", rolloutID); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad rollout id: "+err.Error()+".")
		return nil, "", false
	}
	seq, err := strconv.ParseUint(seqStr, 10, 64)
	if err != nil {
		s.fail(ctx, fasthttp.StatusNotFound, fmt.Sprintf("No call %q: a call is named by its sequence id, a number.", seqStr))
		return nil, "", false
	}
	attempt := string(ctx.QueryArgs().Peek("attempt"))
	if err := checkValue("attempt", attempt); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad attempt id: "+err.Error()+".")
		return nil, "", false
	}
	choice := ctx.QueryArgs().GetUintOrZero("choice")
	if choice < 0 || choice > math.MaxUint32 {
		choice = 0
	}
	qctx, cancel := s.queryCtx(ctx)
	defer cancel()
	found, err := s.store.Call(qctx, export.CallKey{RolloutID: rolloutID, AttemptID: attempt, SequenceID: seq, ChoiceIndex: uint32(choice)})
	if err != nil {
		s.storeFailed(ctx, "call", err)
		return nil, "", false
	}
	if found == nil {
		s.fail(ctx, fasthttp.StatusNotFound, fmt.Sprintf("Call %d (choice %d) of rollout %q was not found in the store.", seq, choice, rolloutID))
		return nil, "", false
	}
	return found, found.AttemptID, true
}

// serveRaw serves a call's stored bodies as plain text (what the
// conversation view shortens).
func (s *Server) serveRaw(ctx *fasthttp.RequestCtx, rolloutID, seqStr string) {
	c, _, ok := s.findCall(ctx, rolloutID, seqStr)
	if !ok {
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.Response.Header.Set("Content-Disposition", "inline")
	// Written into the response buffer part by part: the row read is the
	// only other copy of the bodies.
	for _, part := range []struct{ name, body string }{{"request_body", c.RequestBody}, {"response_message", c.ResponseMessage},
		{"response_body", c.ResponseBody}, {"error", c.Error}} {
		ctx.Response.AppendBodyString("== " + part.name + " ==\n")
		ctx.Response.AppendBodyString(part.body)
		ctx.Response.AppendBodyString("\n\n")
	}
}
