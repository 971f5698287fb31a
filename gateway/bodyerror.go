package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// bodyExample is the shape an agent route's body must have.
const bodyExample = `{"model": "...", "messages": [...]}`

// notObjectMessage says what is wrong with a request body that is not a
// JSON object (rewrite.ErrNotObject) and how to fix it: empty; not JSON,
// with the reason and where (byte offset, line and column); or JSON of
// another kind. It names the Content-Type only when the request sent one
// that is not JSON. It runs only on that error path (it parses the body
// once more with encoding/json, without building a value).
func notObjectMessage(body, contentType []byte) string {
	msg := notObjectReason(body)
	if len(contentType) > 0 && !isJSONType(string(contentType)) {
		msg += " The request's Content-Type is " + quoteShort(string(contentType)) + ": send the body with Content-Type: application/json."
	}
	return msg
}

// notObjectReason is notObjectMessage without the Content-Type hint.
func notObjectReason(body []byte) string {
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) {
		return "request body is empty: send a JSON object, " + bodyExample + "."
	}
	var raw json.RawMessage
	err := json.Unmarshal(body, &raw)
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		// Offset counts the bytes read, the offending one included.
		line, col := lineCol(body, int(min(max(syn.Offset-1, 0), int64(len(body)))))
		return fmt.Sprintf("request body is not valid JSON: %v at byte %d (line %d, column %d).", syn, syn.Offset, line, col)
	}
	if err == nil && body[i] != '{' {
		return fmt.Sprintf("request body is a JSON %s, not an object: send %s.", jsonKind(body[i]), bodyExample)
	}
	// encoding/json and the gateway's scanner differ on it (invalid UTF-8
	// in a string, for one).
	return "request body is not a JSON object the gateway can read: send " + bodyExample + " in valid UTF-8."
}

// lineCol returns the 1-based line and column (in bytes) of the byte at
// index off of b.
func lineCol(b []byte, off int) (line, col int) {
	before := b[:off]
	nl := bytes.LastIndexByte(before, '\n')
	return bytes.Count(before, []byte{'\n'}) + 1, off - nl
}

// jsonKind names the kind of JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
