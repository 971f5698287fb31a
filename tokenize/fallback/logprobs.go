package fallback

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// LogprobIDs collects output ids from the logprobs of a response: a
// non-streaming body, or the data payloads of a stream, fed in order. Per
// choice index it reads
//
//   - chat: choices[].logprobs.content[] entries, whose "token" is
//     "token_id:NNN" (vLLM with return_tokens_as_token_ids) or which carry an
//     integer "id" (llama.cpp);
//   - completions: choices[].logprobs.tokens[] strings "token_id:NNN".
//
// A choice is usable only when every entry gave an id (OK). The zero value is
// ready; Reset reuses it.
type LogprobIDs struct {
	choices []lpChoice
}

type lpChoice struct {
	index   uint32
	ids     []uint32
	entries int  // logprob entries seen
	bad     bool // an entry without an id
}

// Reset forgets everything collected.
func (l *LogprobIDs) Reset() { l.choices = l.choices[:0] }

// Add reads one response body or one SSE data payload ("[DONE]", non-JSON
// payloads and payloads nested deeper than jsonscan.MaxDepth are ignored).
func (l *LogprobIDs) Add(data []byte) {
	if jsonscan.Validate(data) != nil {
		return
	}
	gjson.GetBytes(data, "choices").ForEach(func(_, ch gjson.Result) bool {
		idx, ok := u32(ch.Get("index"))
		if !ok {
			return true
		}
		lp := ch.Get("logprobs")
		if !lp.IsObject() {
			return true
		}
		c := l.choice(idx)
		if content := lp.Get("content"); content.IsArray() {
			content.ForEach(func(_, e gjson.Result) bool {
				c.entries++
				if id, ok := entryID(e); ok {
					c.ids = append(c.ids, id)
				} else {
					c.bad = true
				}
				return true
			})
		} else if toks := lp.Get("tokens"); toks.IsArray() {
			toks.ForEach(func(_, e gjson.Result) bool {
				c.entries++
				if id, ok := tokenIDString(e); ok {
					c.ids = append(c.ids, id)
				} else {
					c.bad = true
				}
				return true
			})
		}
		return true
	})
}

func (l *LogprobIDs) choice(idx uint32) *lpChoice {
	for i := range l.choices {
		if l.choices[i].index == idx {
			return &l.choices[i]
		}
	}
	l.choices = append(l.choices, lpChoice{index: idx})
	return &l.choices[len(l.choices)-1]
}

// IDs returns the output ids of choice index and whether every logprob entry
// of that choice carried an id (false when the choice had no logprobs).
func (l *LogprobIDs) IDs(index uint32) ([]uint32, bool) {
	for i := range l.choices {
		c := &l.choices[i]
		if c.index == index {
			if c.bad || c.entries == 0 && c.ids == nil {
				return nil, false
			}
			return slices.Clone(c.ids), true
		}
	}
	return nil, false
}

// Choices returns the choice indexes seen, in ascending order.
func (l *LogprobIDs) Choices() []uint32 {
	out := make([]uint32, 0, len(l.choices))
	for i := range l.choices {
		out = append(out, l.choices[i].index)
	}
	slices.Sort(out)
	return out
}

// entryID reads a chat logprobs entry's id: llama.cpp's "id", else vLLM's
// "token_id:NNN" token.
func entryID(e gjson.Result) (uint32, bool) {
	if id := e.Get("id"); id.Exists() {
		return u32(id)
	}
	return tokenIDString(e.Get("token"))
}

// tokenIDString parses "token_id:NNN".
func tokenIDString(v gjson.Result) (uint32, bool) {
	if v.Type != gjson.String {
		return 0, false
	}
	s, ok := strings.CutPrefix(v.Str, "token_id:")
	if !ok || s == "" || s[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(n), true
}
