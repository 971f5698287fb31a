package engines

import "github.com/tidwall/gjson"

// TokenIn is an engine kind that serves chat calls token-in (--token-in):
// render messages to ids, generate from ids, derender ids to a chat
// completion, abort a generation. It owns the shapes of those requests and
// answers; the gateway sends them (its transport, with the hang-up watch
// and retries), joins prompts and pumps the stream.
//
// A generate request starts as render's answer (RenderAnswer), gets its
// prompt ids and options (GenerateBody) and, after an abort, continues
// after the ids generated so far (ResumeBody). Its answers are read with
// ParseGenerate (whole) and ParseGenerateChunk (one stream event), and
// derendered with DerenderBody/DerenderAnswer (whole) or
// DerenderStreamTail/DerenderStreamBody/DerenderStreamAnswer (per chunk,
// with the state the engine returns).
type TokenIn interface {
	// TokenInPaths are the kind's token-in endpoints.
	TokenInPaths() TokenInPaths
	// AbortBody is the body of the abort request of the generation with
	// engine request id id (EngineRequestID).
	AbortBody(id string) []byte
	// EngineRequestID is the id the engine knows a generate request by
	// whose request id (GenerateOptions.RequestID) is id.
	EngineRequestID(id string) string

	// RenderAnswer reads render's answer to the chat request chatReq: the
	// generate request it makes (prompt ids not yet set; the request's
	// output limit kept) and the prompt ids.
	RenderAnswer(answer, chatReq []byte) (genReq []byte, prompt []uint32, err error)
	// GenerateBody is the generate request genReq (RenderAnswer's) with
	// the prompt ids prompt and the options o.
	GenerateBody(genReq []byte, prompt []uint32, o GenerateOptions) ([]byte, error)
	// ResumeBody is the generate request that continues genBody (a
	// GenerateBody) after ids, the response ids generated so far: the
	// prompt is prompt + ids, the output limit (when set) is reduced by
	// len(ids), the request id is requestID. left is what the limit leaves
	// (-1: no limit); with left 0 body is not to be sent.
	ResumeBody(genBody []byte, prompt, ids []uint32, requestID string) (body []byte, left int, err error)

	// ParseGenerate reads a whole (non-streamed) generate answer.
	ParseGenerate(answer []byte) (Generated, error)
	// ParseGenerateChunk reads one event of a streamed generate answer
	// (not "[DONE]"); a chunk carries at most one choice.
	ParseGenerateChunk(data []byte) (GenChunk, error)
	// JoinGenerate is the whole generate answer answer preceded by the
	// response ids ids and the logprobs entries lps (raw, comma-separated)
	// of aborted segments; usage (when not nil) replaces its usage and
	// finish (when not "") its finish reason.
	JoinGenerate(answer []byte, ids []uint32, lps, usage []byte, finish string) ([]byte, error)
	// LengthChunk is a generate stream chunk that ends choice 0 with
	// finish reason "length" and no ids (a resumed stream whose output
	// limit was all generated before the abort took effect).
	LengthChunk() []byte

	// DerenderBody is the derender request of the whole generate answer
	// answer to the prompt ids prompt and the chat request chatReq.
	DerenderBody(answer []byte, prompt []uint32, chatReq []byte) ([]byte, error)
	// DerenderAnswer is derender's answer der made into the chat
	// completion the kind's chat route would have answered chatReq with,
	// injected ids included.
	DerenderAnswer(der, answer []byte, prompt []uint32, chatReq []byte) ([]byte, error)
	// DerenderStreamTail is what every streaming derender request of one
	// call ends with (the prompt and the chat request).
	DerenderStreamTail(prompt []uint32, chatReq []byte) []byte
	// DerenderStreamBody appends to dst the streaming derender request of
	// the generate chunk chunk, whose choice ParseGenerateChunk read as ch,
	// with the state the previous answer returned (nil: the first chunk)
	// and tail (DerenderStreamTail). parked: the chunk ends a generation
	// the gateway aborted (finish "abort"), which goes on after a resume,
	// so it is derendered without its finish reason.
	DerenderStreamBody(dst, chunk []byte, ch GenChoice, parked bool, state, tail []byte) ([]byte, error)
	// DerenderStreamAnswer reads a streaming derender answer: the chat
	// chunk and the state for the next request (its Raw is sent back).
	DerenderStreamAnswer(out []byte) (chunk, state gjson.Result, err error)
}

// GenerateOptions are the options of one generate request.
type GenerateOptions struct {
	// Stream asks for a streamed answer; StreamOptions (raw JSON, nil:
	// none) are the client's stream_options.
	Stream        bool
	StreamOptions []byte
	// RequestID names the request ("": the engine's own), so that it can
	// be aborted (EngineRequestID).
	RequestID string
}

// Generated is a whole generate answer, read.
type Generated struct {
	// RequestID is the answer's request id ("" when it names none).
	RequestID string
	// Choices are the answer's choices.
	Choices []GenChoice
	// Usage is the answer's usage object (not IsObject: none).
	Usage gjson.Result
}

// GenChunk is one event of a streamed generate answer, read.
type GenChunk struct {
	// RequestID is the chunk's request id ("" when it names none).
	RequestID string
	// Error: the event is the engine's error event (it goes to the client
	// as it is).
	Error bool
	// HasChoice: the chunk carries Choice (else it is, say, the usage
	// chunk).
	HasChoice bool
	Choice    GenChoice
	// Usage is the chunk's usage object (not IsObject: none).
	Usage gjson.Result
}

// GenChoice is one choice of a generate answer or stream chunk.
type GenChoice struct {
	// Index is the choice's index.
	Index int
	// IDs are its (new) response ids, an end-of-turn token included.
	IDs []uint32
	// Finish is the finish reason ("": not finished); "abort" ends a
	// generation aborted at the engine.
	Finish string
	// StopReason is the chat stop_reason to report (a string or number;
	// else null).
	StopReason gjson.Result
	// Logprobs are the sampled tokens' entries (an array, else none), each
	// {"token_id","logprob","top_logprobs":[{"token_id","logprob"},...]}.
	Logprobs gjson.Result
	// EndedOnTurn: the choice ended on an end-of-turn token (an answer
	// the template closes with that token).
	EndedOnTurn bool
}
