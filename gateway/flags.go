package gateway

import (
	"flag"

	"github.com/rollgate/rollgate/internal/config"
)

// RegisterFlags registers a flag for each scalar setting of c on fs, bound
// to c's field, with the default SetDefaults gives (so the default is
// written once, there); registering writes the defaults into c. The flag
// of a setting is named after its YAML key unless it predates this rule
// (--max-body-bytes is max_request_body_bytes). Backends, ClientKeys and
// UpstreamKeys are lists of structures: they come from the YAML file (and
// the runtime API, and ROLLGATE_CLIENT_KEYS) only; AllowedHosts, a list of
// names, is also a comma-separated flag.
//
// InjectLogprobs is the exception to "the zero Config is the default": the
// flag's default is on, since a gateway that captures for training wants
// the sampled tokens' logprobs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.SetDefaults()
	fs.StringVar(&c.Listen, "listen", d.Listen, "address to serve on")
	config.StringListVar(fs, &c.AllowedHosts, "allowed-hosts", "comma-separated host names or IP addresses, besides loopback ones and the listen and public address, "+
		"that /api/v1, /ui and Agent Lightning's routes serve when they answer without a credential (no ROLLGATE_ADMIN_TOKEN; no agl.key): any other Host, and any cross-site request, gets 403 there "+
		"(DNS rebinding, web pages the operator opens); agent routes serve any Host; \"*\" = every Host")
	fs.StringVar(&c.PublicURL, "public-url", c.PublicURL, "base URL agents reach the gateway at, used in returned base_url (default http://LISTEN)")
	fs.IntVar(&c.MaxRequestBodyBytes, "max-body-bytes", d.MaxRequestBodyBytes, "largest request body accepted; larger ones get 413")
	fs.IntVar(&c.MaxResponseBodyBytes, "max-response-body-bytes", d.MaxResponseBodyBytes, "largest non-streamed backend response accepted; a larger one is a 502")
	fs.IntVar(&c.BackendReadBuffer, "backend-read-buffer", d.BackendReadBuffer, "read buffer of each backend connection in bytes: what one read of a stream takes off the socket, so how many events that arrived together leave in one write to the client (every open stream holds one)")
	fs.DurationVar(&c.UpstreamTimeout, "upstream-timeout", d.UpstreamTimeout, "longest a backend call may take, stream included; 504 if nothing was sent by then")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", d.IdleTimeout, "longest a backend may send nothing: before the response headers (504) and between chunks of a stream (the client then gets an SSE error event)")
	fs.DurationVar(&c.ConnectTimeout, "connect-timeout", d.ConnectTimeout, "longest dialing a backend may take; a failed dial (timed out included) is retried on another replica (--retries), then 502")
	fs.DurationVar(&c.ClientReadTimeout, "client-read-timeout", d.ClientReadTimeout, "longest a client may take to send one request, headers and body (bounds slowloris)")
	fs.DurationVar(&c.ClientWriteTimeout, "client-write-timeout", d.ClientWriteTimeout, "longest a client may leave a response (or one write of a stream) unread before it is disconnected and its backend call cancelled")
	fs.DurationVar(&c.ClientIdleTimeout, "client-idle-timeout", d.ClientIdleTimeout, "close keep-alive client connections idle this long")
	fs.IntVar(&c.Retries, "retries", d.Retries, "times a call that failed before any response byte is retried on another replica (-1 = never)")
	fs.DurationVar(&c.RetryBackoff, "retry-backoff", d.RetryBackoff, "wait before the first retry (see --retries), doubled each time")
	fs.IntVar(&c.UnhealthyAfter, "unhealthy-after", d.UnhealthyAfter, "consecutive failures (calls or health checks) that take a replica out of selection for --unhealthy-cooldown; a call that could not connect or got no answer fails, and so does a stream that stalls past --idle-timeout or breaks off (a stream counts as a success only once it ended)")
	fs.DurationVar(&c.UnhealthyCooldown, "unhealthy-cooldown", d.UnhealthyCooldown, "how long a replica that failed --unhealthy-after times in a row stays out of selection")
	fs.DurationVar(&c.HealthInterval, "health-interval", d.HealthInterval, "period of the active health checks (GET /health) of every replica (negative = off)")
	fs.StringVar(&c.TLSCertFile, "tls-cert", d.TLSCertFile, "serve HTTPS with this certificate (PEM); needs --tls-key")
	fs.StringVar(&c.TLSKeyFile, "tls-key", d.TLSKeyFile, "private key (PEM) for --tls-cert")
	fs.IntVar(&c.MaxConcurrency, "max-concurrency", d.MaxConcurrency, "most LLM calls in progress at once; more wait up to --queue-timeout, then get 429 (0 = no limit)")
	fs.DurationVar(&c.QueueTimeout, "queue-timeout", d.QueueTimeout, "how long a call waits for a free slot under --max-concurrency")
	fs.DurationVar(&c.PauseMaxHold, "pause-max-hold", d.PauseMaxHold, "longest a call waits while the gateway is paused before it gets 503 with Retry-After")
	fs.IntVar(&c.MaxTrackedAttempts, "max-tracked-attempts", d.MaxTrackedAttempts, "(rollout, attempt) pairs whose sequence counters are kept in memory; past it (or --max-tracked-attempt-bytes) the least recently used reserve their next block from the sequence store again")
	fs.Int64Var(&c.MaxTrackedAttemptBytes, "max-tracked-attempt-bytes", d.MaxTrackedAttemptBytes, "memory the sequence counters of --max-tracked-attempts may take, each with its last 4 calls' hashes that recognise client retries (about 670 bytes per attempt with short ids)")
	fs.DurationVar(&c.SequenceStoreTimeout, "sequence-timeout", d.SequenceStoreTimeout,
		"longest a reservation of sequence ids in the database may take (an attempt's first call, whose reservation runs beside the engine's work, and each next block of 16 to 1024 ids, reserved ahead when half the current one is used); past it the call that needs the block gets 503 and counts in rollgate_calls_rejected_total{reason=\"sequence_store\"}; calls that waited for a reservation count in rollgate_sequence_waits_total (see also --queue, --db)")
	fs.BoolVar(&c.ForwardClientAuthorization, "forward-client-authorization", d.ForwardClientAuthorization, "pass the agent's Authorization header to backends that have no key of their own (default: the gateway holds upstream credentials)")
	fs.BoolVar(&c.DisableTokenizeFallback, "disable-tokenize-fallback", d.DisableTokenizeFallback, "do not complete missing or miscounted token ids of vLLM replicas from their /tokenize endpoint and \"token_id:NNN\" logprobs (token_source = tokenize)")
	fs.StringVar(&c.DetokCheck, "detok-check", d.DetokCheck, "decode each call's output ids and compare them with the returned text, off the hot path: engine (the vLLM replica's /detokenize) or a tokenizer.json path; empty = off")
	fs.BoolVar(&c.InjectLogprobs, "inject-logprobs", true, "ask vLLM, SGLang and llama.cpp (chat) engines for the sampled tokens' logprobs (no alternatives) when the client did not, for training (rollout_log_probs); stripped from the client's copy; false = off (the bridge then excludes samples without logprobs as no_logprobs unless --logprobs omit)")
	fs.BoolVar(&c.TokenIn, "token-in", d.TokenIn, "serve vLLM replicas' chat calls token-in: render the messages with the engine's template, send an extending call's prompt as the previous prompt + response ids + the new messages' ids (/inference/v1/generate), and answer with the engine's derender; the token_in column says how each call was served; needs vLLM >= 0.32 with --enable-scale-out; a backend's token_in overrides it; streamed calls use the streamed generate and derender, and with n > 1 the next call extends the choice sent back")
	fs.IntVar(&c.TokenInMaxAttempts, "token-in-max-attempts", d.TokenInMaxAttempts, "attempts whose last call --token-in keeps in memory; past it (or --token-in-max-bytes) the least recently used are evicted and their next call is rendered whole")
	fs.Int64Var(&c.TokenInMaxBytes, "token-in-max-bytes", d.TokenInMaxBytes, "memory the attempts kept by --token-in may take (messages, prompt and response ids)")
	fs.BoolVar(&c.CaptureEmbeddingBodies, "capture-embedding-bodies", d.CaptureEmbeddingBodies, "store the request and response bodies of embedding calls")
	fs.StringVar(&c.Routing, "routing", d.Routing, "how a model's replicas share calls, for pools whose config sets no routing: affine (the calls of one rollout go to one replica while it is healthy and under the load bound, so the engine's prefix cache serves every turn after the first; calls without a rollout id go to the least loaded) or least_outstanding (every call to the least loaded replica); see also --routing-load-factor")
	fs.StringVar(&c.Unattributed, "unattributed", d.Unattributed, "a call on the OpenAI routes that names no rollout (no /rollout/{rollout_id}/attempt/{attempt_id}/v1 base URL, no x-rollout-id header): capture (proxied and captured with an empty rollout_id, listed as (unattributed) in /ui, never selected by the bridge) or refuse (answered 400 with the base URL to use, counted in rollgate_calls_rejected_total{reason=\"unattributed\"}, not captured)")
	fs.Float64Var(&c.RoutingLoadFactor, "routing-load-factor", d.RoutingLoadFactor, "affine routing's load bound c >= 1: a replica holding ceil(c x average outstanding calls) or more is passed over for the rollout's next replica; larger keeps rollouts on their replica under more imbalance")
}
