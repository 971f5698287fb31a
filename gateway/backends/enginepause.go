package backends

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
)

// The engines' own pause routes, which POST /api/v1/pause?engine=MODE
// calls on every replica of a kind that has them (and /resume undoes):
// each engine kind that has some says which (engines.Pausing; vLLM's
// /pause?mode=abort|wait|keep in engines/vllm, SGLang's /pause_generation
// abort|retract|in_place in engines/sglang). llama.cpp and
// OpenAI-compatible services have none.

// EnginePause is how one engine kind pauses its own generation.
type EnginePause struct {
	Kind  openai.Kind
	Modes []string // the engine's own mode names
	p     engines.Pausing
	// ResumePath and ResumeBody undo the pause.
	ResumePath string
	ResumeBody []byte
}

// Request returns the path (with the query) and body of the pause request
// in mode.
func (e EnginePause) Request(mode string) (path string, body []byte) { return e.p.PauseRequest(mode) }

// EnginePauseOf returns kind's pause routes; false when it has none.
func EnginePauseOf(kind openai.Kind) (EnginePause, bool) {
	p, ok := engines.Lookup(kind).(engines.Pausing)
	if !ok {
		return EnginePause{}, false
	}
	path, body := p.ResumeRequest()
	return EnginePause{Kind: kind, Modes: p.PauseModes(), p: p, ResumePath: path, ResumeBody: body}, true
}

// CheckEngineMode says whether mode is an engine pause mode of some kind,
// naming every kind's modes when it is not.
func CheckEngineMode(mode string) error {
	var all []string
	for _, e := range engines.All() {
		p, ok := e.(engines.Pausing)
		if !ok {
			continue
		}
		if slices.Contains(p.PauseModes(), mode) {
			return nil
		}
		all = append(all, e.Kind().String()+": "+strings.Join(p.PauseModes(), "|"))
	}
	return fmt.Errorf("engine: unknown engine pause mode %q: use one of the engines' own modes (%s)", mode, strings.Join(all, "; "))
}

// EnginePauseResult is what one replica's engine answered to a pause or
// resume request (POST /api/v1/pause?engine=... and /resume).
type EnginePauseResult struct {
	Replica string `json:"replica"`
	URL     string `json:"url"`
	Kind    string `json:"kind"`
	Mode    string `json:"mode,omitempty"`
	// Status is the engine's HTTP status; 0 when the request failed or was
	// not sent (Error says why).
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
}
