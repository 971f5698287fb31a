package rewrite

import (
	"bytes"

	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// Stripping restores what the engine would have sent had the gateway not
// injected anything (see docs/engines.md, vLLM >= 0.10.2):
//   - injected keys are set to null (prompt_token_ids, choices[].token_ids,
//     choices[].prompt_token_ids, choices[].logprobs), in whole answers and
//     in stream chunks alike, because vLLM writes them as null when not
//     asked: its chat chunks pass token_ids=None and prompt_token_ids=None
//     explicitly, which exclude_unset keeps
//     (vllm/entrypoints/openai/chat_completion/serving.py, 0.32.0; checked
//     against the real engine by TestRealVLLM);
//   - with include_usage injected, the final usage chunk ("choices":[] and a
//     non-null "usage") is dropped (the stream's reader puts its
//     system_fingerprint back on the finish chunks, see fingerprint.go);
//   - with return_token_ids injected, a chat chunk whose every choice has an
//     empty delta, no finish_reason and no logprobs of the client's is
//     dropped: vLLM sends such chunks only to carry token ids or logprobs a
//     tool/reasoning parser swallowed, so with the client's own logprobs it
//     sends them to a direct call too.
// A stream event whose body is a non-streaming object ("object":
// "chat.completion", as vLLM sends for some completions) follows the
// non-streaming rule. Engines that leave out the keys of fields not asked
// for get those keys deleted everywhere: token ids with OmitIDs (SGLang),
// logprobs with OmitLogprobs (llama.cpp). Everything else is copied byte for
// byte.

// StripBody removes the injected fields from a non-streaming JSON response.
// When nothing changes (nothing injected, another endpoint, an input it cannot
// walk, or no injected field present) it returns body itself; otherwise it
// returns dst with the stripped body appended.
func StripBody(dst, body []byte, endpoint openai.Endpoint, inj Injected) []byte {
	if inj&(ReturnTokenIDs|Logprobs) == 0 || (endpoint != openai.ChatCompletions && endpoint != openai.Completions) {
		return body
	}
	out, _ := strip(dst, body, endpoint, inj, false)
	return out
}

// StripEvent removes the injected fields from the data payload of one SSE
// event (without the "data: " prefix and the blank line). drop reports that
// the whole event must not reach the client. When nothing changes it returns
// data itself; otherwise dst with the stripped payload appended. Non-JSON
// payloads such as [DONE] and error events are returned unchanged.
func StripEvent(dst, data []byte, endpoint openai.Endpoint, inj Injected) (out []byte, drop bool) {
	if inj == 0 || (endpoint != openai.ChatCompletions && endpoint != openai.Completions) {
		return data, false
	}
	if inj&(ReturnTokenIDs|Logprobs) == 0 && !bytes.Contains(data, usageKey) {
		// Only include_usage was injected (the client asked for ids itself,
		// or SGLang chat streams): nothing is ever edited, and only a chunk
		// with a "usage" member can be dropped.
		return data, false
	}
	return strip(dst, data, endpoint, inj, true)
}

// Head is the head of a chat or completions stream's chunks that the
// stripper may skip (StripEventHead): '{' and members that are never
// edited, ending after a comma. vLLM and SGLang repeat the same id, object,
// created and model in every chunk, and capture's assembler finds them
// (capture.Pending.Head). The zero value skips nothing.
type Head struct {
	b       []byte // the head, when usable
	prevEnd int    // end of its last member's value
}

// Set makes h the head of the later chunks: a copy of head when it is '{'
// and only id, object (not "chat.completion", whose chunk follows the
// non-streaming rule), created and model members, each followed by a comma;
// otherwise nothing. It walks head once; Set again only when head changes
// (Matches).
func (h *Head) Set(head []byte) {
	h.b, h.prevEnd = h.b[:0], 0
	if len(head) < 2 || head[0] != '{' {
		return
	}
	prevEnd := 0
	for i := 1; ; i++ {
		if i = jsonscan.SkipWS(head, i); i == len(head) {
			break
		}
		if head[i] != '"' {
			return
		}
		ke := jsonscan.SkipString(head, i)
		if ke < 0 {
			return
		}
		key := string(head[i+1 : ke-1])
		if key != "id" && key != "object" && key != "created" && key != "model" {
			return
		}
		if i = jsonscan.SkipWS(head, ke); i >= len(head) || head[i] != ':' {
			return
		}
		vs := jsonscan.SkipWS(head, i+1)
		ve := jsonscan.SkipValue(head, vs)
		if ve < 0 || key == "object" && string(head[vs:ve]) == `"chat.completion"` {
			return
		}
		prevEnd = ve
		if i = jsonscan.SkipWS(head, ve); i >= len(head) || head[i] != ',' {
			return
		}
	}
	if prevEnd > 0 {
		h.b, h.prevEnd = append(h.b, head...), prevEnd
	}
}

// Matches reports whether h was Set from these bytes (usable or not).
func (h *Head) Matches(head []byte) bool { return h.prevEnd > 0 && bytes.Equal(h.b, head) }

// StripEventHead is StripEvent for a chunk that may start with h: when data
// starts with h's bytes and a member follows them, the walk starts there,
// as if h's members (never edited) had been walked. The result is always
// StripEvent's (FuzzStripHeadMatches).
func StripEventHead(dst, data []byte, endpoint openai.Endpoint, inj Injected, h *Head) (out []byte, drop bool) {
	if inj == 0 || (endpoint != openai.ChatCompletions && endpoint != openai.Completions) {
		return data, false
	}
	if inj&(ReturnTokenIDs|Logprobs) == 0 && !bytes.Contains(data, usageKey) {
		return data, false
	}
	if h == nil || h.prevEnd == 0 || len(data) <= len(h.b) || !bytes.Equal(data[:len(h.b)], h.b) {
		return strip(dst, data, endpoint, inj, true)
	}
	if i := jsonscan.SkipWS(data, len(h.b)); i >= len(data) || data[i] != '"' {
		return strip(dst, data, endpoint, inj, true)
	}
	return stripFrom(dst, data, endpoint, inj, true, len(h.b), h.prevEnd)
}

var usageKey = []byte(`"usage"`)

// writer splices edits into a copy of src appended to dst.
type writer struct {
	src, dst []byte
	copied   int // src[:copied] is done
	changed  bool
	bad      bool
}

func (w *writer) replace(start, end int, text string) {
	if start < w.copied || end < start || end > len(w.src) {
		w.bad = true // edits out of order: never expected, never panic
		return
	}
	w.dst = append(w.dst, w.src[w.copied:start]...)
	w.dst = append(w.dst, text...)
	w.copied = end
	w.changed = true
}

// objEd tracks deletions inside one object so that commas stay right: a
// deleted member takes its preceding comma with it, or, when no member before
// it is kept, the comma that follows it.
type objEd struct {
	pending int // key start of a run of deleted leading members, or -1
	kept    bool
	prevEnd int // end of the previous member's value
}

func newObjEd() objEd { return objEd{pending: -1} }

func (o *objEd) keep(w *writer, m *jsonscan.Member) {
	if o.pending >= 0 {
		w.replace(o.pending, m.KeyStart, "")
		o.pending = -1
	}
	o.kept = true
	o.prevEnd = m.ValEnd
}

func (o *objEd) setNull(w *writer, m *jsonscan.Member) {
	o.keep(w, m)
	if !jsonscan.IsNull(m.Val(w.src)) {
		w.replace(m.ValStart, m.ValEnd, "null")
	}
}

func (o *objEd) del(w *writer, m *jsonscan.Member) {
	switch {
	case o.kept:
		w.replace(o.prevEnd, m.ValEnd, "")
	case o.pending < 0:
		o.pending = m.KeyStart
	}
	o.prevEnd = m.ValEnd
}

func (o *objEd) end(w *writer) {
	if o.pending >= 0 {
		w.replace(o.pending, o.prevEnd, "")
		o.pending = -1
	}
}

func strip(dst, data []byte, endpoint openai.Endpoint, inj Injected, event bool) ([]byte, bool) {
	return stripFrom(dst, data, endpoint, inj, event, 0, 0)
}

// stripFrom is strip. With skip > 0, data[:skip] are members that stay as
// they are (see StripEventHead), the last of them ending at prevEnd, and
// the walk starts at skip.
func stripFrom(dst, data []byte, endpoint openai.Endpoint, inj Injected, event bool, skip, prevEnd int) ([]byte, bool) {
	open := jsonscan.SkipWS(data, 0)
	if open >= len(data) || data[open] != '{' {
		return data, false
	}
	w := writer{src: data, dst: dst}
	ids := inj&ReturnTokenIDs != 0
	lps := inj&Logprobs != 0
	chatEvent := event && endpoint == openai.ChatCompletions
	omitIDs, omitLps := inj&OmitIDs != 0, inj&OmitLogprobs != 0

	choicesSeen, usageSet := false, false
	nChoices := 0
	allFiller := true // every choice has delta {}, no finish_reason and no logprobs of the client's

	top := jsonscan.NewObjIter(data, open, nil)
	ed := newObjEd()
	if skip > 0 {
		// As if the head's members had been walked and kept: the next key
		// starts at skip, without a comma before it.
		top = jsonscan.NewObjIter(data, skip-1, nil)
		ed.kept, ed.prevEnd = true, prevEnd
	}
	var m jsonscan.Member
	for top.NextKey(&m) {
		if string(m.Key(data)) == "choices" && m.ValStart < len(data) && data[m.ValStart] == '[' {
			// Walk the choices once, finding the end of the array on the way.
			ed.keep(&w, &m)
			choicesSeen = true
			arr := jsonscan.NewArrIter(data, m.ValStart, nil)
			for {
				s, ok := arr.NextStart()
				if !ok {
					break
				}
				nChoices++
				if s >= len(data) {
					return data, false // truncated after a comma
				}
				if data[s] != '{' {
					allFiller = false
					end := jsonscan.SkipValue(data, s)
					if end < 0 {
						return data, false
					}
					arr.EndElem(end)
					continue
				}
				filler, end, ok := stripChoice(&w, s, ids, lps, omitIDs, omitLps)
				if !ok {
					return data, false
				}
				allFiller = allFiller && filler
				arr.EndElem(end)
			}
			if arr.Bad {
				return data, false
			}
			top.EndVal(&m, arr.End)
			ed.prevEnd = arr.End
			continue
		}
		if !top.SkipVal(&m) {
			break
		}
		switch string(m.Key(data)) {
		case "object":
			if string(m.Val(data)) == `"chat.completion"` {
				chatEvent = false
			}
			ed.keep(&w, &m)
		case "prompt_token_ids":
			switch {
			case !ids:
				ed.keep(&w, &m)
			case omitIDs:
				ed.del(&w, &m)
			default:
				ed.setNull(&w, &m)
			}
		case "usage":
			usageSet = !jsonscan.IsNull(m.Val(data))
			ed.keep(&w, &m)
		default: // including a "choices" that is not an array
			ed.keep(&w, &m)
		}
	}
	if top.Bad {
		return data, false
	}
	ed.end(&w)
	if w.bad {
		return data, false
	}
	if event && inj&IncludeUsage != 0 && choicesSeen && nChoices == 0 && usageSet {
		return dst, true
	}
	if event && chatEvent && ids && nChoices > 0 && allFiller {
		return dst, true
	}
	if !w.changed {
		return data, false
	}
	return append(w.dst, data[w.copied:]...), false
}

// stripChoice strips one element of "choices" starting at data[open] == '{'.
// It reports whether the choice is a filler (delta {} and finish_reason
// null) and where the element ends; ok is false when it is malformed.
func stripChoice(w *writer, open int, ids, lps, delIDs, delLps bool) (filler bool, end int, ok bool) {
	data := w.src
	emptyDelta, finishNull, lpsNull := false, true, true
	it := jsonscan.NewObjIter(data, open, nil)
	ed := newObjEd()
	var m jsonscan.Member
	for it.Next(&m) {
		switch string(m.Key(data)) {
		case "token_ids", "prompt_token_ids":
			switch {
			case !ids:
				ed.keep(w, &m)
			case delIDs:
				ed.del(w, &m)
			default:
				ed.setNull(w, &m)
			}
		case "logprobs":
			lpsNull = jsonscan.IsNull(m.Val(data))
			switch {
			case !lps:
				ed.keep(w, &m)
			case delLps:
				ed.del(w, &m)
			default:
				ed.setNull(w, &m)
			}
		case "delta":
			emptyDelta = jsonscan.IsEmptyObject(m.Val(data))
			ed.keep(w, &m)
		case "finish_reason":
			finishNull = jsonscan.IsNull(m.Val(data))
			ed.keep(w, &m)
		default:
			ed.keep(w, &m)
		}
	}
	if it.Bad {
		return false, 0, false
	}
	ed.end(w)
	return emptyDelta && finishNull && (lpsNull || lps), it.End, true
}
