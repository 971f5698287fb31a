// Package gateway is rollgate's OpenAI-compatible HTTP front, the hot path:
// the fasthttp server, attribution to rollouts, sequence ids, request
// rewriting for capture (gateway/rewrite), the proxy with its retries,
// streaming and limits, pause and resume. The routing table and replica
// health are package gateway/backends; the /api/v1 surface and OTLP ingest
// (docs/contract.md §2) are a ControlPlane the server mounts.
package gateway

import (
	"fmt"
	"strings"
	"time"

	"github.com/rollgate/rollgate/gateway/seqstore"
)

// Config is the gateway's configuration. Zero values take the documented defaults.
type Config struct {
	// Listen is the address to serve on (default "127.0.0.1:8000").
	Listen string `yaml:"listen"`
	// PublicURL is the base URL agents reach this gateway at, used in the
	// base_url returned by POST /api/v1/rollouts (default "http://" + Listen).
	PublicURL string `yaml:"public_url"`
	// MaxRequestBodyBytes bounds request bodies; larger ones get 413 (default 32 MiB).
	MaxRequestBodyBytes int `yaml:"max_request_body_bytes"`
	// MaxResponseBodyBytes bounds non-streamed upstream responses (default 256 MiB).
	MaxResponseBodyBytes int `yaml:"max_response_body_bytes"`
	// BackendReadBuffer is the read buffer of each backend connection, in
	// bytes (default 8 KiB). It bounds what one read of a stream takes off
	// the socket, and so how many events that arrived together leave in one
	// write to the client; every open stream holds one.
	BackendReadBuffer int `yaml:"backend_read_buffer"`
	// UpstreamTimeout bounds a whole upstream call, stream included (default 10m).
	// A call that has sent nothing when it expires gets 504.
	UpstreamTimeout time.Duration `yaml:"upstream_timeout"`
	// IdleTimeout bounds how long a backend may send nothing: before the
	// response headers (first-byte timeout, 504) and between chunks of a
	// stream (the client then gets an SSE error event) (default 2m).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// ClientReadTimeout bounds reading one request from a client, headers and
	// body, from its first byte (slowloris; default 60s).
	ClientReadTimeout time.Duration `yaml:"client_read_timeout"`
	// ClientWriteTimeout bounds how long a client may leave the gateway
	// unable to write to it: a whole non-streamed response, and each write
	// of a stream (a healthy stream may last far longer). A client that stops
	// reading is disconnected, the backend call cancelled and the captured
	// row says so (default 60s).
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	// ClientIdleTimeout closes keep-alive client connections idle this long (default 2m).
	ClientIdleTimeout time.Duration `yaml:"client_idle_timeout"`
	// ConnectTimeout bounds dialing a backend (default 5s); a failed dial is
	// retried on another replica (Retries), then 502.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// Retries is how many times a call that failed before any response byte
	// (connection refused, reset, closed) is sent again, to another replica
	// when the pool has one (default 2; -1 disables).
	Retries int `yaml:"retries"`
	// RetryBackoff is the wait before the first retry, doubled each time (default 50ms).
	RetryBackoff time.Duration `yaml:"retry_backoff"`
	// UnhealthyAfter consecutive failures (calls or health checks) take a
	// replica out of selection for UnhealthyCooldown (defaults 3 and 10s).
	// A stream that stalls past IdleTimeout or breaks off is a failure; a
	// stream is a success only once it ended.
	UnhealthyAfter    int           `yaml:"unhealthy_after"`
	UnhealthyCooldown time.Duration `yaml:"unhealthy_cooldown"`
	// HealthInterval is the period of active health checks (GET /health) of
	// every replica (default 5s; negative disables).
	HealthInterval time.Duration `yaml:"health_interval"`
	// ClientKeys, when any is set, are the API keys agents must send
	// ("Authorization: Bearer KEY", the OPENAI_API_KEY of an unmodified agent)
	// on the OpenAI routes; the matching key's name is recorded on every
	// captured row (api_key_name). Keys come from the environment.
	ClientKeys []ClientKey `yaml:"client_keys"`
	// TLSCertFile and TLSKeyFile (PEM) make the gateway serve HTTPS.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// Force sets top-level request fields of every call on the OpenAI routes
	// whatever the agent sent (sampling enforcement, e.g. {temperature: 1.0}
	// so RL data is on-policy); each forced field is recorded in the row's
	// overrides column, request_body keeps what the agent sent.
	Force map[string]any `yaml:"force"`
	// ForceModes sets fields per rollout mode, over Force: e.g. {train:
	// {temperature: 1.0}, val: {temperature: 0.7}}. A call's mode is its
	// x-rollout-mode header, else the mode of its rollout in the task queue
	// (POST /api/v1/tasks), known once the rollout runs.
	ForceModes map[string]map[string]any `yaml:"force_modes"`
	// MaxConcurrency bounds the LLM calls in progress (default 0: no limit).
	// A call that finds no free slot within QueueTimeout gets 429 with
	// Retry-After, captured.
	MaxConcurrency int `yaml:"max_concurrency"`
	// QueueTimeout is how long a call waits for a free slot (default 10s).
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// PauseMaxHold is the longest a call waits while the gateway is paused
	// before it is answered 503 with Retry-After (default 5m).
	PauseMaxHold time.Duration `yaml:"pause_max_hold"`
	// MaxTrackedAttempts bounds the (rollout, attempt) pairs whose blocks of
	// sequence ids are kept in memory (default 65536), and
	// MaxTrackedAttemptBytes the memory they are counted to take (default
	// 32 MiB; the heap they use stays within 1.5 × that + 1 MiB, see
	// sequences in sequences.go). Past either, the least recently used are
	// evicted: an evicted attempt reserves its next block from the
	// SequenceStore at its next call, above every earlier one, so its ids
	// never repeat and never start above 1.
	MaxTrackedAttempts     int   `yaml:"max_tracked_attempts"`
	MaxTrackedAttemptBytes int64 `yaml:"max_tracked_attempt_bytes"`
	// SequenceStore reserves sequence ids in blocks in a database, so that
	// they survive restarts and stay unique and increasing across gateways
	// sharing it (rollgate serve: the --queue database, else a file beside
	// the --db file). Required: New refuses a Config without one.
	SequenceStore seqstore.Store `yaml:"-"`
	// SequenceStoreTimeout bounds a reservation of sequence ids (the first
	// call of an attempt, and one call per block); past it the call gets 503
	// and counts in rollgate_calls_rejected_total{reason="sequence_store"}
	// (default 5s).
	SequenceStoreTimeout time.Duration `yaml:"sequence_store_timeout"`
	// AdminToken, when set, is required as "Authorization: Bearer ..." on
	// every /api/v1 route, reads included (controlplane.AdminAuthorized), and
	// on the viewer /ui. Set it through the environment
	// (ROLLGATE_ADMIN_TOKEN), not a file.
	AdminToken string `yaml:"-"`
	// AllowedHosts are the names (or IP addresses) besides loopback ones
	// (localhost, 127.0.0.0/8, ::1), the listen and public address and the
	// address a connection came in on, that the routes answering without a
	// credential serve in the Host header and accept in Origin: /api/v1 and
	// /ui without AdminToken, Agent Lightning's /api and /proxy without its
	// key. Other Hosts and cross-site requests get 403 there (DNS rebinding,
	// pages the operator opens; see crosssite.go). "*" serves every Host.
	// Agent routes serve any Host. Default: none.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// UpstreamKeys is the allow-list of upstream API keys the runtime API
	// may use: environment variable name → the backend origins
	// (scheme://host:port) its value may be sent to. Keys named by the
	// start-time Backends are paired with those replicas' origins already.
	// Variables are read once at start; PUT /api/v1/backends can name only
	// these keys, and only for their origins.
	UpstreamKeys map[string][]string `yaml:"upstream_keys"`
	// ForwardClientAuthorization passes the client's Authorization header to
	// replicas that have no api_key_env of their own (default false: the
	// gateway holds upstream credentials; agents' keys stay with the gateway).
	ForwardClientAuthorization bool `yaml:"forward_client_authorization"`
	// DisableTokenizeFallback turns off completing missing or miscounted
	// token ids of vLLM replicas from their /tokenize endpoint and from
	// "token_id:NNN" logprobs (marked token_source = tokenize). Default: on.
	DisableTokenizeFallback bool `yaml:"disable_tokenize_fallback"`
	// DetokCheck turns on the detokenisation check at capture (off the hot
	// path): "engine" decodes each call's output ids with the vLLM replica's
	// own POST /detokenize, a path decodes them with that Hugging Face
	// tokenizer.json; the decoded text is compared with the returned text and
	// a mismatch adds "detok" to token_check (rollgate_detok_total). "" = off.
	DetokCheck string `yaml:"detok_check"`
	// InjectLogprobs asks the engine for logprobs of sampled tokens when the
	// client did not; they are stripped from the client's copy. The zero
	// Config leaves it off; RegisterFlags (rollgate serve) turns it on unless
	// --inject-logprobs=false or the config file says inject_logprobs: false.
	InjectLogprobs bool `yaml:"inject_logprobs"`
	// TokenIn serves the chat calls of vLLM replicas token-in (issue 31):
	// the gateway renders the messages with the engine's template
	// (/v1/chat/completions/render), and for a call whose messages extend
	// the attempt's previous call plus the answer returned, sends the
	// previous prompt ids + the previous response ids + the new messages'
	// rendered ids to /inference/v1/generate, then turns the ids back into
	// a chat completion with the engine's own parsers
	// (/v1/chat/completions/derender). The token_in column records how
	// each call was served. Streamed calls use the streamed generate and
	// derender (stream_state); with n > 1 the next call extends the choice
	// the agent sent back.
	// A backend's token_in overrides it. Default off.
	TokenIn bool `yaml:"token_in"`
	// TokenInMaxAttempts and TokenInMaxBytes bound the attempts whose last
	// call token-in mode keeps (messages, prompt and response ids): past
	// either the least recently used are evicted
	// (rollgate_token_in_evictions_total) and their next call is rendered
	// whole. Defaults 65536 and 512 MiB.
	TokenInMaxAttempts int   `yaml:"token_in_max_attempts"`
	TokenInMaxBytes    int64 `yaml:"token_in_max_bytes"`
	// CaptureEmbeddingBodies stores request/response bodies of embedding calls (default false).
	CaptureEmbeddingBodies bool `yaml:"capture_embedding_bodies"`
	// Backends is the initial routing table.
	Backends []Backend `yaml:"backends"`
	// Routing is how pools that set no routing of their own pick a replica:
	// "affine" (the default: the calls of one rollout stay on one replica
	// while it is healthy and under the load bound, so its prefix cache
	// serves every turn after the first; see gateway/backends/affinity.go) or
	// "least_outstanding" (every call to the least loaded replica).
	Routing string `yaml:"routing"`
	// RoutingLoadFactor is affine routing's load bound c ≥ 1 for pools that
	// set none: a replica with ceil(c × average outstanding calls) or more is
	// passed over for the rollout's next replica (default 1.25).
	RoutingLoadFactor float64 `yaml:"routing_load_factor"`
	// Unattributed says what becomes of a call on the OpenAI routes that
	// names no rollout (no /rollout/{r}/attempt/{a} prefix, no x-rollout-id
	// header): UnattributedCapture (the default, docs/contract.md §1.1:
	// proxied and captured with empty rollout fields, which the viewer lists
	// as "(unattributed)" and the trainer bridge never selects) or
	// UnattributedRefuse (answered 400 showing the per-rollout base URL,
	// counted in rollgate_calls_rejected_total{reason="unattributed"},
	// never captured).
	Unattributed string `yaml:"unattributed"`
	// Tracing, when set, makes the gateway's own spans (the proxy hop and
	// each backend attempt, see NewTracing); nil (the default) = no tracing
	// work at all. The owner shuts it down after the gateway.
	Tracing *Tracing `yaml:"-"`
}

// SetDefaults fills zero values with the documented defaults.
func (c *Config) SetDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8000"
	}
	if c.PublicURL == "" {
		c.PublicURL = "http://" + c.Listen
		if c.TLSCertFile != "" {
			c.PublicURL = "https://" + c.Listen
		}
	}
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	if c.MaxRequestBodyBytes <= 0 {
		c.MaxRequestBodyBytes = 32 << 20
	}
	if c.MaxResponseBodyBytes <= 0 {
		c.MaxResponseBodyBytes = 256 << 20
	}
	if c.BackendReadBuffer <= 0 {
		c.BackendReadBuffer = 8 << 10
	}
	if c.UpstreamTimeout <= 0 {
		c.UpstreamTimeout = 10 * time.Minute
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.ClientReadTimeout <= 0 {
		c.ClientReadTimeout = time.Minute
	}
	if c.ClientWriteTimeout <= 0 {
		c.ClientWriteTimeout = time.Minute
	}
	if c.ClientIdleTimeout <= 0 {
		c.ClientIdleTimeout = 2 * time.Minute
	}
	switch {
	case c.Retries == 0:
		c.Retries = 2
	case c.Retries < 0:
		c.Retries = 0
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 50 * time.Millisecond
	}
	if c.UnhealthyAfter <= 0 {
		c.UnhealthyAfter = 3
	}
	if c.UnhealthyCooldown <= 0 {
		c.UnhealthyCooldown = 10 * time.Second
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = 5 * time.Second
	}
	if c.QueueTimeout <= 0 {
		c.QueueTimeout = 10 * time.Second
	}
	if c.PauseMaxHold <= 0 {
		c.PauseMaxHold = 5 * time.Minute
	}
	if c.MaxTrackedAttempts <= 0 {
		c.MaxTrackedAttempts = defaultMaxTrackedAttempts
	}
	if c.MaxTrackedAttemptBytes <= 0 {
		c.MaxTrackedAttemptBytes = defaultMaxTrackedAttemptBytes
	}
	if c.SequenceStoreTimeout <= 0 {
		c.SequenceStoreTimeout = defaultSequenceStoreTimeout
	}
	if c.TokenInMaxAttempts <= 0 {
		c.TokenInMaxAttempts = 1 << 16
	}
	if c.TokenInMaxBytes <= 0 {
		c.TokenInMaxBytes = 512 << 20
	}
	if c.Routing == "" {
		c.Routing = RoutingAffine
	}
	if c.RoutingLoadFactor == 0 {
		c.RoutingLoadFactor = DefaultRoutingLoadFactor
	}
	if c.Unattributed == "" {
		c.Unattributed = UnattributedCapture
	}
}

// Unattributed policies (Config.Unattributed).
const (
	UnattributedCapture = "capture"
	UnattributedRefuse  = "refuse"
)

// ClientKey is one API key agents may use.
type ClientKey struct {
	// Name is recorded on captured rows (api_key_name); never the key.
	Name string `yaml:"name"`
	// KeyEnv names the environment variable holding the key.
	KeyEnv string `yaml:"key_env"`
	// Key is the key itself (from KeyEnv, or set in code).
	Key string `yaml:"-"`
}

// ParseClientKeys reads "name=key,name2=key2" (ROLLGATE_CLIENT_KEYS).
func ParseClientKeys(s string) ([]ClientKey, error) {
	var out []ClientKey
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, key, ok := strings.Cut(part, "=")
		if !ok || name == "" || key == "" {
			return nil, fmt.Errorf("client key %q is not name=key", strings.SplitN(part, "=", 2)[0])
		}
		out = append(out, ClientKey{Name: name, Key: key})
	}
	return out, nil
}
