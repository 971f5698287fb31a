package gateway

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Putting vLLM's system_fingerprint back on a stream's finish chunks.
//
// vLLM stamps system_fingerprint on each choice's finish chunk, unless the
// request asked for include_usage: then only the trailing usage chunk
// carries it (vllm/entrypoints/openai/chat_completion/serving.py and
// completion/serving.py, 0.32.0: "Stamp on terminal chunk only when no
// trailing usage chunk will follow"). When the gateway injected
// include_usage it drops that usage chunk from the client's copy, so the
// client would get the fingerprint nowhere. fpHold keeps the client's bytes
// from the first finish chunk on until the usage chunk arrives (for n = 1
// they arrive together; for n > 1 the earlier choices' finish chunks wait
// for the last one), then writes them with the usage chunk's fingerprint
// member appended to each finish chunk, where vLLM would have put it: last,
// after choices. Found by TestRealVLLM against vLLM 0.32.0.
type fpHold struct {
	on   bool   // a vLLM chat or completions stream with include_usage injected
	held []byte // client bytes held back, from the first finish chunk on
	at   []int  // offsets in held of finish chunks' closing braces
}

// reset arms the hold for one stream.
func (h *fpHold) reset(on bool) {
	h.on, h.held, h.at = on, h.held[:0], h.at[:0]
}

// holding reports whether client bytes are being held back.
func (h *fpHold) holding() bool { return len(h.held) > 0 }

// add takes an event's client bytes (data is its payload as the client
// gets it): a finish chunk, or any event after one, is held and reported
// true; otherwise it returns false and the caller writes the bytes itself.
func (h *fpHold) add(client, data []byte) bool {
	if !h.on {
		return false
	}
	finish := hasFinish(data)
	if !finish && !h.holding() {
		return false
	}
	if finish {
		if end := bytes.LastIndexByte(client, '}'); end >= 0 {
			h.at = append(h.at, len(h.held)+end)
		}
	}
	h.held = append(h.held, client...)
	return true
}

// release appends the held bytes to dst, the fingerprint member of usage
// (the dropped usage chunk's payload; nil when none came) put before each
// finish chunk's closing brace, and empties the hold.
func (h *fpHold) release(dst, usage []byte) []byte {
	var fp gjson.Result
	if usage != nil {
		fp = gjson.GetBytes(usage, "system_fingerprint")
	}
	from := 0
	if fp.Type == gjson.String {
		for _, at := range h.at {
			dst = append(dst, h.held[from:at]...)
			dst = append(dst, `,"system_fingerprint":`...)
			dst = append(dst, fp.Raw...)
			from = at
		}
	}
	dst = append(dst, h.held[from:]...)
	h.held, h.at = h.held[:0], h.at[:0]
	return dst
}

// finishKey is what marks a finish chunk: a finish_reason member with a
// string value (a string can hold no unescaped quote, so the bytes cannot
// come from inside one).
const finishKey = `"finish_reason":"`

// hasFinish reports whether data contains finishKey. It is
// bytes.Contains(data, finishKey), searching from the 'f' (rare in a chunk)
// rather than the quote (two per key and string), which bytes.Index would
// stop at: 2.8 % of a streamed call's CPU went to that search.
func hasFinish(data []byte) bool {
	for i := 1; i < len(data); {
		j := bytes.Index(data[i:], []byte(finishKey[1:]))
		if j < 0 {
			return false
		}
		if data[i+j-1] == '"' {
			return true
		}
		i += j + 1
	}
	return false
}
