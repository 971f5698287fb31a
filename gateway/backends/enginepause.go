package backends

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/rollgate/rollgate/internal/openai"
)

// The engines' own pause routes, which POST /api/v1/pause?engine=MODE
// calls on every replica of a kind that has them (and /resume undoes):
//
//   - vLLM 0.32.0 (vllm/entrypoints/rl/online/api_router.py, registered
//     only with VLLM_SERVER_DEV_MODE=1 by
//     entrypoints/launchers/api_server/routers.py; elsewhere 404):
//     POST /pause?mode=abort|wait|keep (abort: in-flight requests end with
//     finish_reason "abort"; wait: returns once they finished; keep: they
//     are frozen in the scheduler and go on after /resume; default abort;
//     a bad mode is 422), POST /resume, GET /is_paused.
//   - SGLang (sgl-project/sglang python/sglang/srt/entrypoints/
//     http_server.py pause_generation / continue_generation and
//     srt/managers/io_struct.py PauseGenerationReqInput, read at commit
//     f11d231c): POST /pause_generation {"mode": "abort"|"retract"|
//     "in_place"} (abort: in-flight requests are aborted and returned;
//     retract: they go back to the waiting queue, their KV cache may be
//     flushed and recomputed; in_place: the scheduler stops with them in
//     place, KV cache kept), POST /continue_generation {}.
//
// llama.cpp and OpenAI-compatible services have none.

// EnginePause is how one engine kind pauses its own generation.
type EnginePause struct {
	Kind  openai.Kind
	Modes []string // the engine's own mode names
	pause func(mode string) (path string, body []byte)
	// ResumePath and ResumeBody undo the pause.
	ResumePath string
	ResumeBody []byte
}

// Request returns the path (with the query) and body of the pause request
// in mode.
func (e EnginePause) Request(mode string) (path string, body []byte) { return e.pause(mode) }

var enginePauses = []EnginePause{
	{Kind: openai.KindVLLM, Modes: []string{"abort", "wait", "keep"},
		pause:      func(mode string) (string, []byte) { return "/pause?mode=" + url.QueryEscape(mode), nil },
		ResumePath: "/resume"},
	{Kind: openai.KindSGLang, Modes: []string{"abort", "retract", "in_place"},
		pause: func(mode string) (string, []byte) {
			return "/pause_generation", []byte(`{"mode":"` + mode + `"}`) // mode is one of Modes
		},
		ResumePath: "/continue_generation", ResumeBody: []byte(`{}`)},
}

// EnginePauseOf returns kind's pause routes; false when it has none.
func EnginePauseOf(kind openai.Kind) (EnginePause, bool) {
	for _, e := range enginePauses {
		if e.Kind == kind {
			return e, true
		}
	}
	return EnginePause{}, false
}

// CheckEngineMode says whether mode is an engine pause mode of some kind,
// naming every kind's modes when it is not.
func CheckEngineMode(mode string) error {
	var all []string
	for _, e := range enginePauses {
		if slices.Contains(e.Modes, mode) {
			return nil
		}
		all = append(all, e.Kind.String()+": "+strings.Join(e.Modes, "|"))
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
