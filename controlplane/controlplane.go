// Package controlplane serves rollgate's control surface on one fasthttp
// router: the /api/v1 routes (backends, pause and resume, rollouts, rewards,
// statuses, self-reported calls, tasks, resources, bridge batches and the
// trainer's lease API) and OTLP trace ingest (/v1/traces). The gateway
// mounts it (gateway.Server.SetControlPlane) and the control plane drives the
// gateway through the small Gateway interface; the stored data it reads and
// writes goes through export.Store, the training loop's queue through
// controlplane/tasks.
package controlplane

import (
	"context"
	"flag"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/controlplane/lease"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/config"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
)

// Gateway is what the control plane needs of the gateway it controls
// (*gateway.Server implements it).
type Gateway interface {
	// Backends returns the routing table, replica state and drain state.
	Backends() backends.View
	// ReplaceBackends swaps the routing table and returns the new one, or
	// says why it cannot.
	ReplaceBackends(spec []backends.Backend) (backends.View, error)
	// Pause holds new calls until Resume; PauseState reports the drain.
	Pause()
	// PauseWith pauses in a mode: "wait" (Pause) or "abort" (streamed
	// token-in generations are aborted and resumed after the update); an
	// unknown mode is an error naming the modes.
	PauseWith(mode string) error
	// PauseEngines calls the engines' own pause routes in their mode
	// (vLLM /pause?mode=, SGLang /pause_generation); ResumeEngines undoes
	// it. An unknown mode is an error and nothing is paused.
	PauseEngines(mode string) ([]backends.EnginePauseResult, error)
	ResumeEngines() []backends.EnginePauseResult
	Resume()
	PauseState() backends.DrainView
	// RegisterRollout records a registered rollout's task id, which the
	// rollout's captured calls carry.
	RegisterRollout(rolloutID, taskID string)
	// NextSequenceID takes the next sequence id of an attempt (for
	// self-reported calls).
	NextSequenceID(rolloutID, attemptID string) (uint64, error)
	// ClientAuthorized checks the agent's API key (OTLP ingest is an agent
	// route).
	ClientAuthorized(ctx *fasthttp.RequestCtx) bool
	// RolloutSeen reports whether calls of the rollout were admitted (by
	// this gateway, or through a shared sequence store by any), before
	// their capture is stored.
	RolloutSeen(ctx context.Context, rolloutID string) (bool, error)
}

var _ Gateway = (*gateway.Server)(nil)

// Config is the control plane's configuration: its own settings, and
// those it shares with the gateway (the fields of gateway.Config of the
// same names, defaults resolved, taken by ConfigOf or Shared).
type Config struct {
	// AdminToken, when set, is required as "Authorization: Bearer ..." on
	// every /api/v1 route. Empty: no check.
	AdminToken string `yaml:"-"`
	// PublicURL is the base URL agents reach the gateway at, used in the
	// per-rollout base URLs handed out.
	PublicURL string `yaml:"-"`
	// MaxRequestBodyBytes bounds a decompressed OTLP body (larger: 413).
	MaxRequestBodyBytes int `yaml:"-"`
	// BridgeLeaseTTL is how long a trainer's lease of samples from
	// /api/v1/bridge/lease lasts before they are handed out again
	// (0: DefaultBridgeLeaseTTL).
	BridgeLeaseTTL time.Duration `yaml:"bridge_lease_ttl"`
	// BridgeTokenizers names the Hugging Face model folders (tokenizer.json,
	// tokenizer_config.json, chat template) that POST /api/v1/bridge/batches
	// may retokenize with: its "retokenize" field is one of these names,
	// never a path (nil: none, retokenizing over HTTP is off). Each is
	// loaded on first use and kept.
	BridgeTokenizers map[string]string `yaml:"bridge_tokenizers"`
}

// DefaultBridgeLeaseTTL is Config.BridgeLeaseTTL's default.
const DefaultBridgeLeaseTTL = 5 * time.Minute

// RegisterFlags registers the control plane's own settings' flags on fs,
// bound to c's fields; registering writes the defaults into c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	ttl := c.BridgeLeaseTTL
	if ttl <= 0 {
		ttl = DefaultBridgeLeaseTTL
	}
	fs.DurationVar(&c.BridgeLeaseTTL, "bridge-lease-ttl", ttl, "how long a trainer's lease of samples from /api/v1/bridge/lease lasts before they return to the queue")
	config.StringMapVar(fs, &c.BridgeTokenizers, "bridge-tokenizers", "tokenizers POST /api/v1/bridge/batches may retokenize with, `name=folder,...` (Hugging Face model folders with tokenizer.json and tokenizer_config.json; the request's \"retokenize\" names one, never a path; files over 64 MiB or not regular are refused); empty = off. See also rollgate bridge --retokenize")
}

// ConfigOf takes the control plane's settings out of a gateway
// configuration, defaults resolved as the gateway resolves them; its own
// settings are their defaults.
func ConfigOf(c gateway.Config) Config { return Config{}.Shared(c) }

// Shared returns c with the settings it shares with the gateway taken from
// g, defaults resolved as the gateway resolves them.
func (c Config) Shared(g gateway.Config) Config {
	g.SetDefaults()
	c.AdminToken, c.PublicURL, c.MaxRequestBodyBytes = g.AdminToken, g.PublicURL, g.MaxRequestBodyBytes
	return c
}

// Server is the control plane: it implements gateway.ControlPlane.
type Server struct {
	cfg     Config
	gw      Gateway
	store   export.Store
	capture *capture.Pipeline
	m       *metrics.Metrics
	log     *slog.Logger

	rollouts  sync.Map                    // rollout_id → *rolloutInfo
	queue     atomic.Pointer[tasks.Queue] // nil: no training-loop routes
	stop      chan struct{}
	closeOnce sync.Once

	// The trainer pull API (/api/v1/bridge/*), made on first use.
	leaseOnce sync.Once
	leases    *lease.Queue

	// The retokenizers of Config.BridgeTokenizers loaded so far, by name;
	// tokMu also makes loads one at a time.
	tokMu sync.Mutex
	toks  map[string]*chattemplate.Retokenizer
}

var _ gateway.ControlPlane = (*Server)(nil)

// rolloutInfo is what the control plane remembers of a registered rollout.
type rolloutInfo struct {
	taskID    string
	groupID   string // the rollouts table's group_id, carried onto status rows
	createdNs uint64
	metadata  string
}

// New builds the control plane of gw. store serves the /api/v1 reads and
// writes and stores OTLP spans; pipe (may be nil) is synced before a
// rollout is reported complete.
func New(cfg Config, gw Gateway, store export.Store, pipe *capture.Pipeline, m *metrics.Metrics, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, gw: gw, store: store, capture: pipe, m: m, log: log, stop: make(chan struct{})}
}

// Close stops the task queue's sweep and ends long polls. Call it once the
// gateway has shut down.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.stop) })
}

// Error types in OpenAI-style error bodies.
const (
	errInvalidRequest = "invalid_request_error"
	errNotFound       = "not_found_error"
	errServer         = "server_error"
	errPermission     = "permission_error"
)

// rejectSequenceStore is rollgate_calls_rejected_total's reason when no
// sequence id could be reserved (the gateway's own reason of that name).
const rejectSequenceStore = "sequence_store"

// plainError answers with an OpenAI-style error.
func (s *Server) plainError(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(gateway.AppendError(nil, status, typ, msg))
}
