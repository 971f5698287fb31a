package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/engines"
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
// client set to a non-null value is left as is; a null value is replaced.
// Nothing is ever injected towards KindOpenAI (a kind whose
// engines.Inject says Nothing, as does a kind no package registered), nor
// for other endpoints. What each kind takes is its engines.Inject
// (engines/vllm, engines/sglang, engines/llamacpp, engines/openai). The rest of the body is copied byte for byte.
//
// An invalid body, a body that is not a JSON object, or a "model", "stream"
// or "n" of the wrong type yields a *RequestError (errors.Is ErrInvalidBody);
// out is then dst unchanged.
func Rewrite(dst, body []byte, endpoint openai.Endpoint, kind openai.Kind, opt Options) (out []byte, info Request, inj Injected, err error) {
	info.N = 1
	open, err := objectStart(body, opt.Validated)
	if err != nil {
		return dst, info, 0, err
	}
	var ms members
	if !ms.scan(body, open) { // cannot happen after Validate; keep the scanner honest
		return dst, info, 0, &RequestError{Reason: "not valid JSON"}
	}
	if err := ms.read(&info, body, endpoint); err != nil {
		return dst, info, 0, err
	}
	so := scanStreamOptions(body, ms.so)
	info.IncludeUsage = so.usage.ok && string(body[so.usage.start:so.usage.end]) == "true"

	e := engines.InjectOf(kind)
	if e.Nothing || (endpoint != openai.ChatCompletions && endpoint != openai.Completions) {
		return append(dst, body...), info, 0, nil
	}
	ed := edits{at: ms.end, comma: ms.any}
	// The order of the calls is the order of the appended members.
	inj = ms.planIDs(&ed, body, endpoint, &e, opt, info.Stream)
	inj |= ms.planUsage(&ed, body, &so, &e, info.Stream)
	inj |= ms.planLogprobs(&ed, body, endpoint, &e, opt, info.Stream)
	return ed.apply(dst, body), info, inj, nil
}

// objectStart validates body (unless validated says Inspect did) and
// returns the offset of its opening '{'.
func objectStart(body []byte, validated bool) (int, error) {
	if !validated {
		if err := jsonscan.Validate(body); errors.Is(err, jsonscan.ErrTooDeep) {
			return 0, &RequestError{Reason: err.Error()}
		} else if err != nil {
			return 0, &RequestError{Reason: "not valid JSON"}
		}
	}
	open := jsonscan.SkipWS(body, 0)
	if open >= len(body) || body[open] != '{' {
		return 0, &RequestError{Reason: "must be a JSON object"}
	}
	return open, nil
}

// members is where Rewrite found the top-level members it reads or may
// replace, and where it appends new ones.
type members struct {
	model, stream, n, ids, so, lp, tlp, asIDs, tools, nProbs span

	// end is the end of the last member (just after '{' when none): where
	// members are appended.
	end int
	// any says the object has members: an appended one needs a leading comma.
	any bool
}

// scan finds the members of the object opening at body[open]; later
// duplicates win, as in the engines' JSON decoders. It returns false when
// the object is malformed.
func (ms *members) scan(body []byte, open int) bool {
	ms.end = open + 1
	it := jsonscan.NewObjIter(body, open, nil)
	var m jsonscan.Member
	for it.Next(&m) {
		ms.any = true
		ms.end = m.ValEnd
		s := span{start: m.ValStart, end: m.ValEnd, ok: true}
		switch string(m.Key(body)) {
		case "model":
			ms.model = s
		case "stream":
			ms.stream = s
		case "n":
			ms.n = s
		case "return_token_ids":
			ms.ids = s
		case "stream_options":
			ms.so = s
		case "logprobs":
			ms.lp = s
		case "top_logprobs":
			ms.tlp = s
		case "return_tokens_as_token_ids":
			ms.asIDs = s
		case "tools":
			ms.tools = s
		case "n_probs":
			ms.nProbs = s
		}
	}
	return !it.Bad
}

// read fills info from the members, checking the types of "model",
// "stream" and "n" in that order (info keeps what was read before an error).
func (ms *members) read(info *Request, body []byte, endpoint openai.Endpoint) error {
	if !ms.model.null(body) {
		v := body[ms.model.start:ms.model.end]
		if v[0] != '"' {
			return &RequestError{Field: "model", Reason: "must be a string, got " + jsonType(v)}
		}
		raw := v[1 : len(v)-1]
		if bytes.IndexByte(raw, '\\') < 0 {
			info.Model = raw
		} else {
			info.Model = []byte(gjson.ParseBytes(v).String())
		}
	}
	if !ms.stream.null(body) {
		switch v := body[ms.stream.start:ms.stream.end]; string(v) {
		case "true":
			info.Stream = true
		case "false":
		default:
			return &RequestError{Field: "stream", Reason: "must be a boolean, got " + jsonType(v)}
		}
	}
	if !ms.n.null(body) {
		v, err := parseN(body[ms.n.start:ms.n.end])
		if err != nil {
			return err
		}
		info.N = v
	}
	info.ReturnTokenIDs = ms.ids.ok && string(body[ms.ids.start:ms.ids.end]) == "true"
	if !ms.lp.null(body) {
		v := body[ms.lp.start:ms.lp.end]
		if endpoint == openai.Completions {
			// A number, or true: vLLM's lax int validator and llama.cpp
			// both read true as 1 (docs/engines.md).
			info.Logprobs = v[0] == '-' || (v[0] >= '0' && v[0] <= '9') || string(v) == "true"
		} else {
			info.Logprobs = string(v) == "true"
		}
	}
	return nil
}

// streamOptions is where Rewrite found the members of stream_options it
// reads, when stream_options is an object.
type streamOptions struct {
	usage, contUsage span // include_usage, continuous_usage_stats
	end              int  // the end of its last member (just after '{' when none)
	any              bool // it has members
	object           bool // stream_options is an object
}

// scanStreamOptions finds include_usage and continuous_usage_stats in the
// stream_options value at so.
func scanStreamOptions(body []byte, so span) (o streamOptions) {
	o.object = so.ok && body[so.start] == '{'
	if !o.object {
		return o
	}
	it := jsonscan.NewObjIter(body, so.start, nil)
	o.end = so.start + 1
	var m jsonscan.Member
	for it.Next(&m) {
		o.any = true
		o.end = m.ValEnd
		s := span{start: m.ValStart, end: m.ValEnd, ok: true}
		switch string(m.Key(body)) {
		case "include_usage":
			o.usage = s
		case "continuous_usage_stats":
			o.contUsage = s
		}
	}
	return o
}

// planIDs plans "return_token_ids":true towards the kinds that take it
// (vLLM and SGLang; not for SGLang streaming chat, which rejects it, nor
// when the ids come from logprobs).
func (ms *members) planIDs(ed *edits, body []byte, endpoint openai.Endpoint, e *engines.Inject, opt Options, stream bool) Injected {
	if !e.ReturnTokenIDs || !ms.ids.null(body) || opt.IDsFromLogprobs ||
		(e.NoIDsOnStreamedChat && endpoint == openai.ChatCompletions && stream) {
		return 0
	}
	inj := ReturnTokenIDs
	if e.OmitsIDs {
		inj |= OmitIDs
	}
	if ms.ids.ok {
		ed.replace(ms.ids, "true")
	} else {
		ed.appendMember(textIDs)
	}
	return inj
}

// planUsage plans stream_options.include_usage:true: only on streams; not
// when the client set it, nor when stream_options is not an object (the
// engine refuses it anyway), nor with continuous_usage_stats (injecting
// would add usage to every chunk). Not towards llama.cpp: there the usage
// chunk takes the "timings" the finish chunk carries otherwise, and capture
// reads the counts from those timings instead (docs/engines.md).
func (ms *members) planUsage(ed *edits, body []byte, so *streamOptions, e *engines.Inject, stream bool) Injected {
	continuous := so.object && !so.contUsage.null(body) && string(body[so.contUsage.start:so.contUsage.end]) != "false"
	if !stream || e.NoStreamUsage || !so.usage.null(body) || !(ms.so.null(body) || so.object) || continuous {
		return 0
	}
	switch {
	case !ms.so.ok:
		ed.appendMember(textUsage)
	case !so.object: // null
		ed.replace(ms.so, textUsageObj)
	case so.usage.ok: // null
		ed.replace(so.usage, "true")
	default:
		t := textIncludeUsage
		if !so.any {
			t = t[1:]
		}
		ed.insert(so.end, t)
	}
	return IncludeUsage
}

// planLogprobs plans the logprobs of the sampled tokens: with
// opt.Logprobs, for ids from logprobs (vLLM before 0.10.2, with
// "return_tokens_as_token_ids":true), and towards llama.cpp, which returns
// output ids only as the "id" of logprobs entries (chat and completions
// alike). llama.cpp refuses logprobs on a streamed chat request with tools
// (docs/engines.md), so such calls get none and are captured without output
// ids; a client's own n_probs already makes it send the entries. Chat
// refuses top_logprobs without logprobs:true; injecting would turn that
// error into a success, so such requests are left alone.
func (ms *members) planLogprobs(ed *edits, body []byte, endpoint openai.Endpoint, e *engines.Inject, opt Options, stream bool) Injected {
	llama := e.IDsInLogprobs
	fromLogprobs := opt.IDsFromLogprobs && e.TokensAsIDs && ms.lp.null(body) && ms.tlp.null(body) && ms.asIDs.null(body)
	llamaLogprobs := llama && ms.lp.null(body) && ms.tlp.null(body) && ms.nProbs.null(body) &&
		!(endpoint == openai.ChatCompletions && stream && nonEmptyArray(body, ms.tools))
	var inj Injected
	if (opt.Logprobs && !llama || fromLogprobs || llamaLogprobs) &&
		ms.lp.null(body) && (endpoint != openai.ChatCompletions || ms.tlp.null(body)) {
		inj |= ms.injectLogprobs(ed, endpoint, llama)
	}
	if fromLogprobs {
		inj |= TokensAsIDs
		if ms.asIDs.ok {
			ed.replace(ms.asIDs, "true")
		} else {
			ed.appendMember(textTokensAsIDs)
		}
	}
	return inj
}

// injectLogprobs plans the logprobs member itself (and top_logprobs towards
// llama.cpp's chat), the client having asked for none.
func (ms *members) injectLogprobs(ed *edits, endpoint openai.Endpoint, llama bool) Injected {
	inj := Logprobs
	text, val := textLogprobsChat, "true"
	switch {
	case endpoint == openai.ChatCompletions && llama:
		// Chat logprobs keys are left out when not asked for; top_logprobs
		// 1 is llama.cpp's smallest n_probs that still returns entries
		// (its default is 20 alternatives per token).
		inj |= OmitLogprobs
		if ms.tlp.ok {
			ed.replace(ms.tlp, "1")
		}
	case endpoint == openai.Completions && llama:
		// n_probs = logprobs; 0 would return no entries at all.
		text, val = textLogprobsCmpl1, "1"
	case endpoint == openai.Completions:
		text, val = textLogprobsCmpl, "0"
	}
	if ms.lp.ok {
		ed.replace(ms.lp, val)
	} else {
		ed.appendMember(text)
	}
	if endpoint == openai.ChatCompletions && llama && !ms.tlp.ok {
		ed.appendMember(textTopLogprobs1)
	}
	return inj
}

// edits are the changes Rewrite makes to a body, applied in one copy.
type edits struct {
	list  [6]edit
	n     int
	at    int  // where members are appended (members.end)
	comma bool // an appended member needs a leading comma
}

// appendMember plans text (a member with its leading comma) at the end of
// the object; the first member of an empty object goes without the comma.
func (ed *edits) appendMember(text string) {
	if !ed.comma {
		text = text[1:]
	}
	ed.comma = true
	ed.insert(ed.at, text)
}

// replace plans text in place of the value at s.
func (ed *edits) replace(s span, text string) {
	ed.list[ed.n] = edit{s.start, s.end, text}
	ed.n++
}

// insert plans text at offset at.
func (ed *edits) insert(at int, text string) {
	ed.list[ed.n] = edit{at, at, text}
	ed.n++
}

// apply appends body with the edits made to dst.
func (ed *edits) apply(dst, body []byte) []byte {
	list := ed.list[:ed.n]
	// Stable insertion sort by position: appended members share members.end
	// and keep their order.
	for i := 1; i < len(list); i++ {
		for j := i; j > 0 && list[j].start < list[j-1].start; j-- {
			list[j], list[j-1] = list[j-1], list[j]
		}
	}
	out := dst
	prev := 0
	for _, e := range list {
		out = append(out, body[prev:e.start]...)
		out = append(out, e.text...)
		prev = e.end
	}
	return append(out, body[prev:]...)
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
