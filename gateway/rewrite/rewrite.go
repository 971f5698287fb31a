package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// Options tune what Rewrite injects. The zero value injects only what token
// capture needs (token ids and usage).
type Options struct {
	// Logprobs injects logprobs when the client did not ask for them (chat:
	// "logprobs":true; completions: "logprobs":0, the sampled token only).
	// Off by default: logprobs cost engine time and response bytes.
	Logprobs bool
	// IDsFromLogprobs is for vLLM engines that cannot return token ids
	// (before 0.10.2): instead of return_token_ids, ask for the sampled
	// tokens' logprobs with "return_tokens_as_token_ids":true, so every
	// logprob entry names its id ("token_id:NNN"). Done only when the client
	// asked for no logprobs itself (the token strings it would see change
	// otherwise); the logprobs are stripped from the client's copy.
	IDsFromLogprobs bool
	// Validated says the body already passed Inspect (which validates it),
	// so Rewrite does not validate it again: a full pass over the body, ≈140
	// µs for a 110 KB conversation, on every call and every retry.
	Validated bool
}

// Inspect validates a request body once, before it is routed: err is nil
// when body is valid JSON whose top level is an object, nested at most
// jsonscan.MaxDepth deep; jsonscan.ErrTooDeep when it nests deeper (checked
// before anything else reads it); ErrNotObject otherwise. model is the raw
// value of its "model" member (nil when absent; the last one when it is
// repeated, as Rewrite and the engines' JSON decoders read it). Keys are
// compared as written (an escaped key does not match). Pass
// Options.Validated to Rewrite afterwards.
func Inspect(body []byte) (model []byte, err error) {
	if err := jsonscan.Validate(body); err != nil {
		if errors.Is(err, jsonscan.ErrTooDeep) {
			return nil, err
		}
		return nil, ErrNotObject
	}
	open := jsonscan.SkipWS(body, 0)
	if open >= len(body) || body[open] != '{' {
		return nil, ErrNotObject
	}
	it := jsonscan.NewObjIter(body, open, nil)
	var m jsonscan.Member
	for it.Next(&m) {
		if string(m.Key(body)) == "model" {
			model = m.Val(body)
		}
	}
	if it.Bad {
		return nil, ErrNotObject
	}
	return model, nil
}

// ErrNotObject is Inspect's verdict on a body that is not valid JSON or
// whose top level is not an object.
var ErrNotObject = errors.New("request body is not a JSON object")

// Injected records which fields Rewrite added to a request; the same fields
// must be stripped from the client's copy of the response. A field the client
// set itself is never listed.
type Injected uint8

// Injected flags.
const (
	// ReturnTokenIDs: "return_token_ids":true was added.
	ReturnTokenIDs Injected = 1 << iota
	// IncludeUsage: stream_options.include_usage:true was added.
	IncludeUsage
	// Logprobs: logprobs were requested.
	Logprobs
	// TokensAsIDs: "return_tokens_as_token_ids":true was added (always with Logprobs).
	TokensAsIDs
	// OmitIDs: the engine leaves the token id keys out of answers that did
	// not ask for them (SGLang), so injected ids are deleted from the
	// client's copy rather than set to null. Only set with ReturnTokenIDs.
	OmitIDs
	// OmitLogprobs: the engine leaves the logprobs key out of answers that
	// did not ask for them (llama.cpp), so injected logprobs are deleted
	// rather than set to null. Only set with Logprobs.
	OmitLogprobs
)

// String lists the flags, for logs ("return_token_ids|include_usage").
func (f Injected) String() string {
	if f == 0 {
		return "none"
	}
	var b []byte
	add := func(s string) {
		if len(b) > 0 {
			b = append(b, '|')
		}
		b = append(b, s...)
	}
	if f&ReturnTokenIDs != 0 {
		add("return_token_ids")
	}
	if f&IncludeUsage != 0 {
		add("include_usage")
	}
	if f&Logprobs != 0 {
		add("logprobs")
	}
	if f&TokensAsIDs != 0 {
		add("return_tokens_as_token_ids")
	}
	if f&OmitIDs != 0 {
		add("omit_ids")
	}
	if f&OmitLogprobs != 0 {
		add("omit_logprobs")
	}
	return string(b)
}

// Request is what Rewrite read from the client's body.
type Request struct {
	// Model is the "model" string. It aliases the input body unless the JSON
	// string contained escapes (then it is a fresh copy); nil when absent or null.
	Model []byte
	// Stream is the "stream" flag (false when absent or null).
	Stream bool
	// N is "n" (1 when absent or null).
	N int
	// ReturnTokenIDs is true when the client itself sent "return_token_ids":true.
	ReturnTokenIDs bool
	// Logprobs is true when the client itself asked for logprobs (chat:
	// "logprobs":true; completions: a number, or true, read as 1).
	Logprobs bool
	// IncludeUsage is true when the client itself sent
	// "stream_options":{"include_usage":true}.
	IncludeUsage bool
}

// ErrInvalidBody is wrapped by every RequestError: errors.Is(err,
// ErrInvalidBody) means the gateway should answer HTTP 400.
var ErrInvalidBody = errors.New("invalid request body")

// RequestError is a request body the gateway refuses (HTTP 400): not JSON,
// not an object, or a field of the wrong type.
type RequestError struct {
	Field  string // the offending top-level field, "" for the body as a whole
	Reason string
}

// Error renders the message sent back to the client.
func (e *RequestError) Error() string {
	if e.Field == "" {
		return "invalid request body: " + e.Reason
	}
	return fmt.Sprintf("invalid request body: field %q %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidBody.
func (e *RequestError) Unwrap() error { return ErrInvalidBody }

// maxN bounds "n": larger values are refused rather than parsed.
const maxN = 1 << 20

// edit replaces body[start:end] with text.
type edit struct {
	start, end int
	text       string
}

// span is the position of a top-level member's value; ok when present.
type span struct {
	start, end int
	ok         bool
}

func (s span) null(b []byte) bool { return !s.ok || jsonscan.IsNull(b[s.start:s.end]) }

// Texts of the injected members; the first appended member of an empty
// object goes without the leading comma.
const (
	textIDs          = `,"return_token_ids":true`
	textUsage        = `,"stream_options":{"include_usage":true}`
	textUsageObj     = `{"include_usage":true}`
	textIncludeUsage = `,"include_usage":true`
	textLogprobsChat = `,"logprobs":true`
	textLogprobsCmpl = `,"logprobs":0`
	// llama.cpp: the smallest counts that still return the sampled token's entry.
	textLogprobsCmpl1 = `,"logprobs":1`
	textTopLogprobs1  = `,"top_logprobs":1`
	textTokensAsIDs   = `,"return_tokens_as_token_ids":true`
)

// Rewrite validates a client's request body, reads the fields the gateway
// needs (info) and appends to dst the body to send upstream, with the fields
// listed in inj injected.
//
// For chat completions and completions towards vLLM or SGLang it adds
// "return_token_ids":true (not for SGLang streaming chat, which rejects it),
// for streams "stream_options":{"include_usage":true} (merged into an existing
// stream_options object; never towards llama.cpp), and with opt.Logprobs the
// logprobs of the sampled tokens. Towards llama.cpp it asks for the sampled
// tokens' logprobs, whose entries carry the ids (chat: "logprobs":true,
// "top_logprobs":1; completions: "logprobs":1), except on a streamed chat
// request with tools, which llama.cpp refuses with logprobs. Nothing is
// injected that the engine refuses for the request's shape. A field the
// client set to a non-null value is left as is; a null value is replaced. Nothing is ever injected towards KindOpenAI, nor for
// other endpoints. The rest of the body is copied byte for byte.
//
// An invalid body, a body that is not a JSON object, or a "model", "stream"
// or "n" of the wrong type yields a *RequestError (errors.Is ErrInvalidBody);
// out is then dst unchanged.
func Rewrite(dst, body []byte, endpoint openai.Endpoint, kind openai.Kind, opt Options) (out []byte, info Request, inj Injected, err error) {
	info.N = 1
	if !opt.Validated {
		if err := jsonscan.Validate(body); errors.Is(err, jsonscan.ErrTooDeep) {
			return dst, info, 0, &RequestError{Reason: err.Error()}
		} else if err != nil {
			return dst, info, 0, &RequestError{Reason: "not valid JSON"}
		}
	}
	open := jsonscan.SkipWS(body, 0)
	if open >= len(body) || body[open] != '{' {
		return dst, info, 0, &RequestError{Reason: "must be a JSON object"}
	}

	var model, stream, n, ids, so, lp, tlp, asIDs, tools, nProbs span
	lastEnd := open + 1 // where members are appended
	hasMembers := false
	it := jsonscan.NewObjIter(body, open, nil)
	var m jsonscan.Member
	for it.Next(&m) {
		hasMembers = true
		lastEnd = m.ValEnd
		s := span{start: m.ValStart, end: m.ValEnd, ok: true}
		// Later duplicates win, as in the engines' JSON decoders.
		switch string(m.Key(body)) {
		case "model":
			model = s
		case "stream":
			stream = s
		case "n":
			n = s
		case "return_token_ids":
			ids = s
		case "stream_options":
			so = s
		case "logprobs":
			lp = s
		case "top_logprobs":
			tlp = s
		case "return_tokens_as_token_ids":
			asIDs = s
		case "tools":
			tools = s
		case "n_probs":
			nProbs = s
		}
	}
	if it.Bad { // cannot happen after ValidBytes; keep the scanner honest
		return dst, info, 0, &RequestError{Reason: "not valid JSON"}
	}

	if !model.null(body) {
		v := body[model.start:model.end]
		if v[0] != '"' {
			return dst, info, 0, &RequestError{Field: "model", Reason: "must be a string, got " + jsonType(v)}
		}
		raw := v[1 : len(v)-1]
		if bytes.IndexByte(raw, '\\') < 0 {
			info.Model = raw
		} else {
			info.Model = []byte(gjson.ParseBytes(v).String())
		}
	}
	if !stream.null(body) {
		switch v := body[stream.start:stream.end]; string(v) {
		case "true":
			info.Stream = true
		case "false":
		default:
			return dst, info, 0, &RequestError{Field: "stream", Reason: "must be a boolean, got " + jsonType(v)}
		}
	}
	if !n.null(body) {
		v, err := parseN(body[n.start:n.end])
		if err != nil {
			return dst, info, 0, err
		}
		info.N = v
	}
	info.ReturnTokenIDs = ids.ok && string(body[ids.start:ids.end]) == "true"
	if !lp.null(body) {
		v := body[lp.start:lp.end]
		if endpoint == openai.Completions {
			// A number, or true: vLLM's lax int validator and llama.cpp
			// both read true as 1 (docs/engines.md).
			info.Logprobs = v[0] == '-' || (v[0] >= '0' && v[0] <= '9') || string(v) == "true"
		} else {
			info.Logprobs = string(v) == "true"
		}
	}

	// stream_options: find include_usage / continuous_usage_stats inside.
	var usage, contUsage span
	soEnd := 0
	soMembers := false
	soObject := so.ok && body[so.start] == '{'
	if soObject {
		sit := jsonscan.NewObjIter(body, so.start, nil)
		soEnd = so.start + 1
		for sit.Next(&m) {
			soMembers = true
			soEnd = m.ValEnd
			s := span{start: m.ValStart, end: m.ValEnd, ok: true}
			switch string(m.Key(body)) {
			case "include_usage":
				usage = s
			case "continuous_usage_stats":
				contUsage = s
			}
		}
		info.IncludeUsage = usage.ok && string(body[usage.start:usage.end]) == "true"
	}

	if kind == openai.KindOpenAI || (endpoint != openai.ChatCompletions && endpoint != openai.Completions) {
		return append(dst, body...), info, 0, nil
	}

	var edits [6]edit
	ne := 0
	comma := hasMembers
	appendMember := func(text string) {
		if !comma {
			text = text[1:]
		}
		comma = true
		edits[ne] = edit{lastEnd, lastEnd, text}
		ne++
	}
	replace := func(s span, text string) {
		edits[ne] = edit{s.start, s.end, text}
		ne++
	}

	fromLogprobs := opt.IDsFromLogprobs && kind == openai.KindVLLM && lp.null(body) && tlp.null(body) && asIDs.null(body)
	llama := kind == openai.KindLlamaCpp
	// llama.cpp returns output ids only as the "id" of logprobs entries
	// (chat and completions alike). It refuses logprobs on a streamed chat
	// request with tools (docs/engines.md), so such calls get none and are
	// captured without output ids; a client's own n_probs already makes it
	// send the entries.
	llamaLogprobs := llama && lp.null(body) && tlp.null(body) && nProbs.null(body) &&
		!(endpoint == openai.ChatCompletions && info.Stream && nonEmptyArray(body, tools))
	if (kind == openai.KindVLLM || kind == openai.KindSGLang) && ids.null(body) && !opt.IDsFromLogprobs &&
		!(kind == openai.KindSGLang && endpoint == openai.ChatCompletions && info.Stream) {
		inj |= ReturnTokenIDs
		if kind == openai.KindSGLang {
			inj |= OmitIDs
		}
		if ids.ok {
			replace(ids, "true")
		} else {
			appendMember(textIDs)
		}
	}

	// include_usage: only on streams; not when the client set it, nor when
	// stream_options is not an object (the engine refuses it anyway), nor with
	// continuous_usage_stats (injecting would add usage to every chunk).
	// Not towards llama.cpp: there the usage chunk takes the "timings" the
	// finish chunk carries otherwise, and capture reads the counts from those
	// timings instead (docs/engines.md).
	continuous := soObject && !contUsage.null(body) && string(body[contUsage.start:contUsage.end]) != "false"
	if info.Stream && !llama && usage.null(body) && (so.null(body) || soObject) && !continuous {
		inj |= IncludeUsage
		switch {
		case !so.ok:
			appendMember(textUsage)
		case !soObject: // null
			replace(so, textUsageObj)
		case usage.ok: // null
			replace(usage, "true")
		default:
			t := textIncludeUsage
			if !soMembers {
				t = t[1:]
			}
			edits[ne] = edit{soEnd, soEnd, t}
			ne++
		}
	}

	// logprobs: chat refuses top_logprobs without logprobs:true; injecting
	// would turn that error into a success, so leave such requests alone.
	if (opt.Logprobs && !llama || fromLogprobs || llamaLogprobs) &&
		lp.null(body) && (endpoint != openai.ChatCompletions || tlp.null(body)) {
		inj |= Logprobs
		text, val := textLogprobsChat, "true"
		switch {
		case endpoint == openai.ChatCompletions && llama:
			// Chat logprobs keys are left out when not asked for; top_logprobs
			// 1 is llama.cpp's smallest n_probs that still returns entries
			// (its default is 20 alternatives per token).
			inj |= OmitLogprobs
			if tlp.ok {
				replace(tlp, "1")
			}
		case endpoint == openai.Completions && llama:
			// n_probs = logprobs; 0 would return no entries at all.
			text, val = textLogprobsCmpl1, "1"
		case endpoint == openai.Completions:
			text, val = textLogprobsCmpl, "0"
		}
		if lp.ok {
			replace(lp, val)
		} else {
			appendMember(text)
		}
		if endpoint == openai.ChatCompletions && llama && !tlp.ok {
			appendMember(textTopLogprobs1)
		}
	}

	if fromLogprobs {
		inj |= TokensAsIDs
		if asIDs.ok {
			replace(asIDs, "true")
		} else {
			appendMember(textTokensAsIDs)
		}
	}

	// Stable insertion sort by position: appended members share lastEnd and
	// keep their order.
	for i := 1; i < ne; i++ {
		for j := i; j > 0 && edits[j].start < edits[j-1].start; j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
	out = dst
	prev := 0
	for _, e := range edits[:ne] {
		out = append(out, body[prev:e.start]...)
		out = append(out, e.text...)
		prev = e.end
	}
	out = append(out, body[prev:]...)
	return out, info, inj, nil
}

// nonEmptyArray reports whether s is a JSON array with at least one element
// (llama.cpp's "has tools": tools.is_array() && !tools.empty()).
func nonEmptyArray(body []byte, s span) bool {
	if !s.ok || body[s.start] != '[' {
		return false
	}
	i := jsonscan.SkipWS(body, s.start+1)
	return i < s.end && body[i] != ']'
}

// parseN parses "n": an integer (2.0 is accepted, as the engines' validators
// do) between 1 and maxN.
func parseN(v []byte) (int, error) {
	if c := v[0]; c != '-' && (c < '0' || c > '9') {
		return 0, &RequestError{Field: "n", Reason: "must be an integer, got " + jsonType(v)}
	}
	x := 0
	digits := true
	for _, c := range v {
		if c < '0' || c > '9' {
			digits = false
			break
		}
		if x = x*10 + int(c-'0'); x > maxN {
			return 0, &RequestError{Field: "n", Reason: fmt.Sprintf("must be at most %d, got %s", maxN, v)}
		}
	}
	if !digits {
		f, err := strconv.ParseFloat(string(v), 64)
		if err == nil && f > maxN {
			return 0, &RequestError{Field: "n", Reason: fmt.Sprintf("must be at most %d, got %s", maxN, v)}
		}
		if err != nil || f < -maxN || f != float64(int64(f)) {
			return 0, &RequestError{Field: "n", Reason: "must be an integer, got " + string(v)}
		}
		x = int(f)
	}
	if x < 1 {
		return 0, &RequestError{Field: "n", Reason: "must be at least 1, got " + string(v)}
	}
	return x, nil
}

// jsonType names the JSON type of a raw value, for error messages.
func jsonType(v []byte) string {
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
