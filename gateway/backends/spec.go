// Package backends is the gateway's routing table and replica health: the
// models it routes and the replicas serving each (Backend, Replica), the
// live table the proxy reads on every call (Set, Table, Pool, Upstream),
// replica selection (rollout-affine or least outstanding), health from calls
// and from active checks, the engine-kind probe, the upstream API keys and
// one HTTP client per backend origin. The proxy itself (attempts, retries,
// streaming) is package gateway's; the control plane changes the table
// through gateway.Server.ReplaceBackends.
package backends

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
)

// Backend is one model and the replicas that serve it.
type Backend struct {
	// Model is the name clients put in "model". "*" matches any model not
	// listed elsewhere (used with a single --upstream).
	Model string `yaml:"model" json:"model"`
	// Replicas serve the model; Routing says which one takes a call.
	Replicas []Replica `yaml:"replicas" json:"replicas"`
	// Routing is "affine" (calls of one rollout to one replica while it is
	// healthy and not overloaded) or "least_outstanding" (the replica with
	// the fewest outstanding requests, weights breaking ties); empty = the
	// gateway's Config.Routing (default affine).
	Routing string `yaml:"routing" json:"routing,omitempty"`
	// LoadFactor is affine routing's bound c ≥ 1 (see Config.RoutingLoadFactor);
	// 0 = the gateway's.
	LoadFactor float64 `yaml:"load_factor" json:"load_factor,omitempty"`
	// TokenIn turns token-in mode on (true) or off (false) for this model's
	// chat calls whatever the gateway's Config.TokenIn; nil = the gateway's.
	// Only vLLM replicas serve it (their /v1/chat/completions/render,
	// /inference/v1/generate and /v1/chat/completions/derender, vLLM >= 0.32
	// started with --enable-scale-out).
	TokenIn *bool `yaml:"token_in" json:"token_in,omitempty"`
}

// Replica is one inference server.
type Replica struct {
	// Name identifies the replica in captured rows and metrics (default: its URL).
	Name string `yaml:"name" json:"name,omitempty"`
	// URL is the OpenAI base URL, ending in /v1 (e.g. http://10.0.0.5:8000/v1).
	URL string `yaml:"url" json:"url"`
	// Kind is vllm, sglang, llamacpp, openai or auto (default auto: probe /version and /v1/models).
	Kind string `yaml:"kind" json:"kind,omitempty"`
	// Weight biases selection among equally loaded replicas (default 1).
	Weight int `yaml:"weight" json:"weight,omitempty"`
	// PolicyVersion is the weights version served, recorded on every captured row.
	PolicyVersion string `yaml:"policy_version" json:"policy_version,omitempty"`
	// APIKeyEnv names an environment variable holding the upstream API key,
	// sent as "Authorization: Bearer ..." (secrets stay out of config files).
	APIKeyEnv string `yaml:"api_key_env" json:"api_key_env,omitempty"`
	// ServedModel, when set, replaces "model" in requests sent to this replica.
	ServedModel string `yaml:"served_model" json:"served_model,omitempty"`
	// TokenIDs says how a vLLM replica gives token ids: "engine"
	// (return_token_ids, vLLM >= 0.10.2), "logprobs" (logprobs with
	// return_tokens_as_token_ids, for older vLLM; completed by the /tokenize
	// fallback at capture), or "auto" (default: from GET /version).
	TokenIDs string `yaml:"token_ids" json:"token_ids,omitempty"`
}

// Validate checks a routing table and says which entry is wrong.
func Validate(bs []Backend) error {
	seen := map[string]bool{}
	for i, b := range bs {
		if b.Model == "" {
			return fmt.Errorf("backends[%d]: model is empty", i)
		}
		if seen[b.Model] {
			return fmt.Errorf("backends[%d]: model %q listed twice", i, b.Model)
		}
		seen[b.Model] = true
		if len(b.Replicas) == 0 {
			return fmt.Errorf("backends[%d] (model %q): no replicas", i, b.Model)
		}
		if err := validRouting(b.Routing, b.LoadFactor, "routing", "load_factor"); err != nil {
			return fmt.Errorf("backends[%d] (model %q): %w", i, b.Model, err)
		}
		for j, r := range b.Replicas {
			if err := TokenInKind(b.TokenIn != nil && *b.TokenIn, r.Kind); err != nil {
				return fmt.Errorf("backends[%d].replicas[%d]: %w", i, j, err)
			}
			u, err := url.Parse(r.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("backends[%d].replicas[%d]: url %q is not an http(s) URL like http://host:8000/v1", i, j, r.URL)
			}
			if !knownKind(r.Kind) {
				return fmt.Errorf("backends[%d].replicas[%d]: kind %q is not one of %s, auto", i, j, r.Kind, strings.Join(kindNames(), ", "))
			}
			if r.Weight < 0 {
				return fmt.Errorf("backends[%d].replicas[%d]: weight %d is negative", i, j, r.Weight)
			}
		}
	}
	return nil
}

// TokenInKind refuses token-in mode (on) for a replica of a configured
// engine kind that has no token-in endpoints (engines.TokenIn: vLLM); kind
// "auto" is resolved by the probe: a replica found to be another kind has
// its calls passed through, token_in = "passthrough:kind".
func TokenInKind(on bool, kind string) error {
	if kind == "" || kind == "auto" || !on {
		return nil
	}
	if k, err := openai.ParseKind(kind); err == nil && knownKind(kind) {
		if _, ok := engines.Lookup(k).(engines.TokenIn); ok {
			return nil
		}
	}
	var have []string
	for _, e := range engines.All() {
		if _, ok := e.(engines.TokenIn); ok {
			have = append(have, e.Kind().String())
		}
	}
	return fmt.Errorf("token_in: kind %q has no token-in endpoints (render, token-in generate, derender) that rollgate uses; only %s has; turn token_in off for this backend", kind, strings.Join(have, ", "))
}

// View is the routing table as GET /api/v1/backends shows it.
type View struct {
	Backends []PoolView `json:"backends"`
	Drain    DrainView  `json:"drain"`
}

// PoolView is one model's pool of replicas.
type PoolView struct {
	Model    string        `json:"model"`
	Replicas []ReplicaView `json:"replicas"`
	// Routing and LoadFactor are the pool's effective policy (defaults resolved).
	Routing    string  `json:"routing"`
	LoadFactor float64 `json:"load_factor,omitempty"`
}

// ReplicaView is one replica: its configuration, the engine kind it was
// found to be, the calls it holds and whether it is healthy.
type ReplicaView struct {
	Replica
	ResolvedKind string `json:"resolved_kind,omitempty"`
	Outstanding  int64  `json:"outstanding"`
	Healthy      bool   `json:"healthy"`
}

// DrainView is the drain state reported by POST /api/v1/pause and /resume
// and GET /api/v1/backends: whether the gateway holds new calls (it fills
// Paused, PausedSince and HeldCalls) and the calls the replicas still have
// in flight (Table.InFlight).
type DrainView struct {
	Paused      bool   `json:"paused"`
	PausedSince int64  `json:"paused_since_unix_nano,omitempty"`
	HeldCalls   int64  `json:"held_calls"`
	InFlight    int64  `json:"in_flight"`
	Drained     bool   `json:"drained"`
	State       string `json:"state"`
	// Mode is the pause's mode while paused: "wait" or "abort".
	Mode string `json:"mode,omitempty"`
	// ParkedStreams counts the streams a pause in mode abort aborted that
	// wait for the resume to go on.
	ParkedStreams int64 `json:"parked_streams"`
	// Engines is what each engine answered to its own pause or resume
	// route (POST /api/v1/pause?engine=MODE, then /resume); only in those
	// answers.
	Engines []EnginePauseResult `json:"engines,omitempty"`
}

// knownKind says whether kind is a replica kind as users write it: "",
// "auto", or the exact name of a registered engine kind ("llama.cpp" too).
func knownKind(kind string) bool {
	switch kind {
	case "", "auto", "llama.cpp":
		return true
	}
	k, err := openai.ParseKind(kind)
	return err == nil && k.String() == kind && engines.Lookup(k) != nil
}

// kindNames are the registered engine kinds' names.
func kindNames() []string {
	var out []string
	for _, e := range engines.All() {
		out = append(out, e.Kind().String())
	}
	return out
}
