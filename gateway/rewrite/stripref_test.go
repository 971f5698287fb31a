package rewrite

import (
	"bytes"
	"testing"

	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// The stripper as it was before the walk was made cheaper (commit "rewrite:
// cheaper StripEvent"), with the later OmitIDs/OmitLogprobs rules, kept as the
// oracle of FuzzStripMatchesReference: the optimised stripper must give
// exactly its output for every input. A change to what is stripped goes here
// too.

func refSkipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

func refSkipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return refSkipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				j := refSkipString(b, i)
				if j < 0 {
					return -1
				}
				i = j - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) {
		c := b[j]
		if c == ',' || c == '}' || c == ']' || c == ':' || c == '{' || c == '[' || c == '"' || jsonscan.IsWS(c) {
			break
		}
		j++
	}
	if j == i {
		return -1
	}
	return j
}

type refObjIter struct {
	b     []byte
	i     int
	first bool
	bad   bool
	end   int // index just after the closing '}', once next returned false without bad
}

func refNewObjIter(b []byte, open int) refObjIter {
	return refObjIter{b: b, i: open + 1, first: true}
}

func (it *refObjIter) next(m *jsonscan.Member) bool {
	b := it.b
	i := jsonscan.SkipWS(b, it.i)
	if i >= len(b) {
		it.bad = true
		return false
	}
	if b[i] == '}' {
		it.end = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.bad = true
			return false
		}
		i = jsonscan.SkipWS(b, i+1)
	}
	it.first = false
	if i >= len(b) || b[i] != '"' {
		it.bad = true
		return false
	}
	m.KeyStart = i
	i = refSkipString(b, i)
	if i < 0 {
		it.bad = true
		return false
	}
	m.KeyEnd = i
	i = jsonscan.SkipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		it.bad = true
		return false
	}
	i = jsonscan.SkipWS(b, i+1)
	m.ValStart = i
	i = refSkipValue(b, i)
	if i < 0 {
		it.bad = true
		return false
	}
	m.ValEnd = i
	it.i = i
	return true
}

type refArrIter struct {
	b     []byte
	i     int
	first bool
	bad   bool
}

func refNewArrIter(b []byte, open int) refArrIter {
	return refArrIter{b: b, i: open + 1, first: true}
}

func (it *refArrIter) next() (start, end int, ok bool) {
	b := it.b
	i := jsonscan.SkipWS(b, it.i)
	if i >= len(b) {
		it.bad = true
		return 0, 0, false
	}
	if b[i] == ']' {
		return 0, 0, false
	}
	if !it.first {
		if b[i] != ',' {
			it.bad = true
			return 0, 0, false
		}
		i = jsonscan.SkipWS(b, i+1)
	}
	it.first = false
	start = i
	end = refSkipValue(b, i)
	if end < 0 {
		it.bad = true
		return 0, 0, false
	}
	it.i = end
	return start, end, true
}

func refStrip(dst, data []byte, endpoint openai.Endpoint, inj Injected, event bool) ([]byte, bool) {
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

	top := refNewObjIter(data, open)
	ed := newObjEd()
	var m jsonscan.Member
	for top.next(&m) {
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
		case "choices":
			ed.keep(&w, &m)
			if data[m.ValStart] != '[' {
				break
			}
			choicesSeen = true
			arr := refNewArrIter(data, m.ValStart)
			for {
				s, _, ok := arr.next()
				if !ok {
					break
				}
				nChoices++
				if data[s] != '{' {
					allFiller = false
					continue
				}
				if !refStripChoice(&w, s, ids, lps, omitIDs, omitLps) {
					allFiller = false
				}
			}
			if arr.bad {
				return data, false
			}
		default:
			ed.keep(&w, &m)
		}
	}
	if top.bad {
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

func refStripChoice(w *writer, open int, ids, lps, delIDs, delLps bool) (filler bool) {
	data := w.src
	emptyDelta, finishNull, lpsNull := false, true, true
	it := refNewObjIter(data, open)
	ed := newObjEd()
	var m jsonscan.Member
	for it.next(&m) {
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
	if it.bad {
		w.bad = true
		return false
	}
	ed.end(w)
	return emptyDelta && finishNull && (lpsNull || lps)
}

// FuzzStripMatchesReference: StripEvent and StripBody give exactly what the
// reference stripper gives, bytes and drop verdict, for any input, endpoint
// and flags (the cheaper walk and its shortcuts change nothing).
//
//	go test -run '^$' -fuzz FuzzStripMatchesReference -fuzztime 60s ./gateway/rewrite/
func FuzzStripMatchesReference(f *testing.F) {
	for _, rt := range chatStreamTrips {
		f.Add([]byte(rt.with), uint8(rt.ep), uint8(rt.inj), true)
		f.Add([]byte(rt.without), uint8(rt.ep), uint8(IncludeUsage), true)
	}
	for _, rt := range chatBodyTrips {
		f.Add([]byte(rt.with), uint8(rt.ep), uint8(rt.inj), false)
	}
	f.Add([]byte(`{"choices":[{"token_ids":[1],"x":{"token_ids":"]"}}]}`), uint8(openai.ChatCompletions), uint8(7), true)
	f.Add([]byte(`{"choices":[{"a" 1},{"token_ids":[1]}],"usage":{}}`), uint8(openai.ChatCompletions), uint8(3), true)
	f.Add([]byte(`{"choices":[{"delta":{"content":"\\\"]}"}},1,"x\""],"prompt_token_ids":[1]}`), uint8(openai.ChatCompletions), uint8(1), true)
	f.Add([]byte(`{"choices":[],"usage":{"prompt_tokens":1}}`), uint8(openai.Completions), uint8(2), true)
	f.Add([]byte(`{"id":"c","object":"chat.completion","created":1, "model":"m","prompt_token_ids":[1],"choices":[{"index":0,"delta":{},"token_ids":[2],"finish_reason":null}]}`), uint8(openai.ChatCompletions), uint8(3), true)
	f.Add([]byte(`{"id":"c","model":"m","prompt_token_ids":[1]}`), uint8(openai.ChatCompletions), uint8(1), true)
	f.Add([]byte(`{"id":"c" , "model":"m",  "choices":[{"index":0,"delta":{"content":"a"},"token_ids":[2],"logprobs":{"content":[]}}],"prompt_token_ids":[1]}`), uint8(openai.ChatCompletions), uint8(19), true)
	f.Fuzz(func(t *testing.T, data []byte, ep, inj uint8, event bool) {
		endpoint, flags := openai.Endpoint(ep%5), Injected(inj&63)
		var got, want []byte
		var gotDrop, wantDrop bool
		rewritten := endpoint == openai.ChatCompletions || endpoint == openai.Completions
		if event {
			got, gotDrop = StripEvent(nil, data, endpoint, flags)
			want = data
			if flags != 0 && rewritten {
				want, wantDrop = refStrip(nil, data, endpoint, flags, true)
			}
		} else {
			got = StripBody(nil, data, endpoint, flags)
			want = data
			if flags&(ReturnTokenIDs|Logprobs) != 0 && rewritten {
				want, _ = refStrip(nil, data, endpoint, flags, false)
			}
		}
		if gotDrop != wantDrop || !bytes.Equal(got, want) {
			t.Fatalf("strip(%q, %v, %v, event=%v) = %q, drop %v; reference %q, drop %v", data, endpoint, flags, event, got, gotDrop, want, wantDrop)
		}
		if !event {
			return
		}
		// StripEventHead gives the same for every head Set accepts: each
		// prefix of data that ends after a comma (and after the whitespace
		// following it).
		var h Head
		for k := 1; k < len(data); k++ {
			if data[k-1] != ',' {
				continue
			}
			for _, end := range []int{k, jsonscan.SkipWS(data, k)} {
				h.Set(data[:end])
				if !h.Matches(data[:end]) {
					continue
				}
				hGot, hDrop := StripEventHead(nil, data, endpoint, flags, &h)
				if hDrop != wantDrop || !bytes.Equal(hGot, want) {
					t.Fatalf("StripEventHead(%q, head %q, %v, %v) = %q, drop %v; reference %q, drop %v", data, data[:end], endpoint, flags, hGot, hDrop, want, wantDrop)
				}
			}
		}
	})
}
