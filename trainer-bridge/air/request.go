package air

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// request decodes p's request body (messages and declared tools) once, as
// decodeRequest does. The usual body is read by fastRequest, its tool
// declarations through decls (nil: no cache); whatever fastRequest does not
// follow exactly goes to decodeRequest.
func (p *parsed) request(decls *declCache) {
	if p.reqDone {
		return
	}
	p.reqDone = true
	msgs, d, ok := fastRequest(jsonscan.Bytes(p.c.RequestBody), decls)
	if !ok {
		p.reqMsgs, p.tools, p.toolsSeen = decodeRequest(p.c.RequestBody)
		return
	}
	p.reqMsgs = msgs
	if d != nil {
		p.tools, p.toolsSeen = d.tools, d.seen
	}
}

// requestBody is what the rules read of a request body.
type requestBody struct {
	Messages []message `json:"messages"`
	Tools    toolDecls `json:"tools"`
}

// toolDecls are a request's tool declarations.
type toolDecls []struct {
	Function struct {
		Name       string         `json:"name"`
		Parameters map[string]any `json:"parameters"`
	} `json:"function"`
}

// byName returns the declared tools' parameters by name (a later
// declaration of a name wins), and whether any tool is declared; nil, false
// for none.
func (ts toolDecls) byName() (tools map[string]map[string]any, seen bool) {
	if len(ts) == 0 {
		return nil, false
	}
	tools = map[string]map[string]any{}
	for _, t := range ts {
		tools[t.Function.Name] = t.Function.Parameters
	}
	return tools, true
}

// decodeRequest decodes a request body with encoding/json: the first JSON
// value of body (what follows it is not read), numbers in the parameters as
// json.Number; nothing at all when that fails, at any point.
func decodeRequest(body string) (msgs []message, tools map[string]map[string]any, seen bool) {
	var req requestBody
	d := json.NewDecoder(strings.NewReader(body))
	d.UseNumber()
	if d.Decode(&req) != nil {
		return nil, nil, false
	}
	tools, seen = req.Tools.byName()
	return req.Messages, tools, seen
}

// requestFields are the members of a request body that fastRequest reads,
// as encoding/json names the fields.
var requestFields = [...]string{"messages", "tools"}

// fastRequest decodes b as decodeRequest does and reports true, or reports
// false when b is not of the shape it reads:
//   - whitespace and a value that is not an object (encoding/json sets
//     nothing: null is no field, another value is an error), or
//   - whitespace, then an object whose keys are as fastMessage's (a known
//     name in any case is its field, no field twice), with messages null or
//     an array of nulls and messages that fastMessage decodes, tools null
//     or an array that decls decodes (encoding/json, cached by its text),
//     unknown members anything; then anything, which Decode does not read.
//
// The object is validated as it is read (gjson's rules, which are
// encoding/json's but for its nesting limit, checked first on long texts).
// Anything else (a value of another type, a field twice, a key with an
// escape or a non-ASCII byte, JSON that encoding/json rejects, nesting
// deeper than it accepts) is decodeRequest's. b is only read, and no part
// of msgs shares its memory; d, when not nil, is read-only and may be
// shared with other calls.
func fastRequest(b []byte, decls *declCache) (msgs []message, d *decoded, ok bool) {
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, nil, true
	}
	if len(b) > 2*maxDepth && !shallow(b) {
		return nil, nil, false
	}
	var tools []byte
	end := members(b, i, requestFields[:], func(f, v int) int {
		switch f {
		case 0:
			return messages(b, v, &msgs)
		case 1:
			if end, done := nullOr(b, v, '['); done {
				return end
			}
			end, ok := jsonscan.ValidValue(b, v)
			if !ok {
				return -1
			}
			tools = b[v:end]
			return end
		}
		return skip(b, v)
	})
	if end < 0 {
		return nil, nil, false
	}
	if tools != nil {
		if d = decls.get(tools); d == nil {
			return nil, nil, false
		}
	}
	return msgs, d, true
}

// messages decodes the messages value at b[i] into *msgs (nil) and returns
// the offset after it, or -1 (see fastRequest).
func messages(b []byte, i int, msgs *[]message) int {
	if end, done := nullOr(b, i, '['); done {
		return end
	}
	*msgs = []message{} // [] decodes to an empty slice, not nil
	i, done := inside(b, i, ']')
	for !done {
		if i >= len(b) {
			return -1
		}
		*msgs = append(*msgs, message{})
		if end, done := nullOr(b, i, '{'); done {
			i = end // null: a zero message
		} else {
			i = messageAt(b, i, &(*msgs)[len(*msgs)-1])
		}
		if i < 0 {
			return -1
		}
		i, done = after(b, i, ']')
	}
	return i
}

// decoded is what the rules read of a request's tool declarations (see
// parsed).
type decoded struct {
	tools map[string]map[string]any
	seen  bool
}

// declCache holds the tool declarations decoded lately, by the text of the
// tools value: every request of an attempt, and of a training run, usually
// declares the same tools, and decoding them is most of the work of reading
// a request. What it holds is read-only. The zero value and nil are ready
// to use (nil caches nothing); it is safe for concurrent use.
type declCache struct {
	mu sync.Mutex
	m  map[string]*decoded
}

// The cache holds at most maxDecls declarations of at most maxDeclBytes
// each (longer ones are decoded every time); when it is full it is emptied.
const (
	maxDecls     = 32
	maxDeclBytes = 64 << 10
)

// get returns the declarations of the tools value raw (a valid JSON array,
// inside a text that encoding/json's nesting limit accepts) as decoding the
// request body with encoding/json gives them when it succeeds; nil when
// encoding/json fails on raw (then it fails on the body too).
func (c *declCache) get(raw []byte) *decoded {
	if c == nil || len(raw) > maxDeclBytes {
		return decodeDecls(raw)
	}
	c.mu.Lock()
	d, ok := c.m[string(raw)]
	c.mu.Unlock()
	if ok {
		return d
	}
	if d = decodeDecls(raw); d == nil {
		return nil
	}
	c.mu.Lock()
	if len(c.m) >= maxDecls || c.m == nil {
		c.m = make(map[string]*decoded, maxDecls)
	}
	c.m[string(raw)] = d
	c.mu.Unlock()
	return d
}

// decodeDecls decodes the tools value raw with encoding/json, as
// decodeRequest does within a body; nil when it fails.
func decodeDecls(raw []byte) *decoded {
	var ts toolDecls
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&ts) != nil {
		return nil
	}
	d := &decoded{}
	d.tools, d.seen = ts.byName()
	return d
}
