package gateway

import (
	"bytes"
	"strings"

	"github.com/rollgate/rollgate/internal/openai"
)

// rolloutBaseURL is the form of a per-rollout base URL.
const rolloutBaseURL = "/rollout/{rollout_id}/attempt/{attempt_id}/v1"

// unknownRouteMessage is the 404 message of a path no route serves. A path
// under /rollout/ that is not a per-rollout call (an attempt segment or the
// /v1 missing) also gets the expected form, with the caller's rollout id
// and endpoint in an example when they are usable ids.
func unknownRouteMessage(method, path []byte) string {
	msg := "unknown route " + string(method) + " " + truncate(string(path), 256)
	if !bytes.HasPrefix(path, prefixRollout) {
		return msg
	}
	msg += ": per-rollout calls go to " + rolloutBaseURL + "/... (OpenAI routes: chat/completions, completions, responses, embeddings, models)"
	rollout, attempt, rest, ok := splitRolloutPath(path)
	if !ok { // no attempt segment: /rollout/{r}/v1/...
		r, after, _ := bytes.Cut(path[len(prefixRollout):], []byte("/"))
		rollout, attempt, rest = r, []byte("1"), append([]byte("/"), after...)
	}
	endpoint, isV1 := strings.CutPrefix(string(rest), "/v1/")
	if !isV1 {
		endpoint = strings.TrimPrefix(string(rest), "/")
	}
	if ValidID(rollout) && ValidID(attempt) && (routeOf([]byte("/v1/"+endpoint)) != openai.Unknown || endpoint == "models") {
		msg += ", e.g. /rollout/" + string(rollout) + "/attempt/" + string(attempt) + "/v1/" + endpoint
	}
	return msg
}
