package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/config"
)

// fileConfig is everything rollgate serve is configured with. The YAML
// file of --config (deploy/rollgate.example.yaml) decodes into it, and
// every component's RegisterFlags binds its flags to the same fields, so
// internal/config fills it in one order: a flag on the command line > its
// ROLLGATE_* environment variable > the file > the default. A component
// plugs in with a field here and one line in registerFlags.
type fileConfig struct {
	Gateway gateway.Config `yaml:",inline"`
	// ControlPlane is the control plane's own settings (bridge_lease_ttl).
	ControlPlane controlplane.Config `yaml:",inline"`
	// AGL serves Agent Lightning v1.0's API gateway routes (controlplane/agl).
	AGL agl.Config `yaml:"agl"`
	// Store is where captured calls go (clickhouse, clickhouse_ttl_days, db).
	Store storeConfig `yaml:",inline"`
	// Sequences is the sequence store's retention (sequence_retention).
	Sequences sequenceConfig `yaml:",inline"`
	// Spool keeps captured rows on local disk while the store is down or
	// slow; serve keeps one spool per store, and the capture WAL, in Dir.
	Spool spool.Config `yaml:"spool"`
	// OTLP exports every captured call as an OpenTelemetry span (GenAI
	// semantic conventions), and the gateway's own spans; off unless
	// otlp.endpoint is set.
	OTLP otlpConfig `yaml:"otlp"`
	// Queue is the training loop's task queue and resources.
	Queue queueConfig `yaml:"queue"`
	// Redact rewrites stored text before it reaches any store (secrets, PII
	// in prompts); token ids and what the client receives are untouched.
	// A list of rules: the file only.
	Redact []capture.RedactRule `yaml:"redact"`
	// Capture sizes the capture pipeline and its write-ahead log.
	Capture captureConfig `yaml:"capture"`
	// UI is the trajectory viewer at /ui (ui, ui_tokenizer).
	UI uiConfig `yaml:",inline"`
	// Serve holds the settings of the command line and environment only.
	Serve serveFlags `yaml:"-"`
}

// registerFlags registers every component's flags on fs, bound to c. A new
// flag also needs its line in serveSections (help.go), its group in --help.
func (c *fileConfig) registerFlags(fs *flag.FlagSet) {
	c.Gateway.RegisterFlags(fs)
	c.ControlPlane.RegisterFlags(fs)
	c.AGL.RegisterFlags(fs)
	c.Store.RegisterFlags(fs)
	c.Sequences.RegisterFlags(fs)
	c.Spool.RegisterFlags(fs)
	c.OTLP.RegisterFlags(fs)
	c.Queue.RegisterFlags(fs)
	c.Capture.RegisterFlags(fs)
	c.UI.RegisterFlags(fs)
	c.Serve.RegisterFlags(fs)
}

// loadServeConfig reads serve's configuration from args, the environment
// and the --config file (see fileConfig), and checks it.
func loadServeConfig(args []string, stdout io.Writer) (*fileConfig, config.Result, error) {
	fs := newFlagSet("serve", serveSummary, stdout, serveSections...)
	c := &fileConfig{}
	c.registerFlags(fs)
	res, err := config.Load(fs, args, "config", c)
	if err != nil {
		return nil, res, flagError(fs, err)
	}
	c.Store.setDefaults()
	return c, res, c.check(res)
}

// check refuses settings serve cannot run with, naming the flag to change.
func (c *fileConfig) check(res config.Result) error {
	if r := c.OTLP.GatewaySampleRatio; !(r >= 0 && r <= 1) {
		return fmt.Errorf("--otlp-gateway-sample-ratio %v: want a fraction from 0 (off) to 1 (every call)", r)
	}
	if c.OTLP.GatewaySampleRatio > 0 && res.Explicit("otlp-gateway-sample-ratio") && !c.OTLP.Enabled() {
		return fmt.Errorf("--otlp-gateway-sample-ratio needs --otlp-endpoint (where the spans go); set --otlp-gateway-sample-ratio 0 or an endpoint")
	}
	return nil
}

// gatewayTracing is the sample ratio of the gateway's own spans: 0 when
// off, or when the ratio is its default and no OTLP endpoint is set.
func (c *fileConfig) gatewayTracing() float64 {
	if !c.OTLP.Enabled() {
		return 0
	}
	return c.OTLP.GatewaySampleRatio
}

// storeConfig is where serve captures to.
type storeConfig struct {
	// ClickHouse is a DSN (clickhouse://host:9000/db); empty uses the embedded store.
	ClickHouse string `yaml:"clickhouse"`
	// ClickHouseTTLDays expires captured rows after this many days on
	// servers that support TTL (0 = keep forever).
	ClickHouseTTLDays int `yaml:"clickhouse_ttl_days"`
	// DB is the embedded SQLite store's path (default defaultDB), also
	// holding the task queue and sequence ids unless Queue.DSN is set.
	DB string `yaml:"db"`
}

// defaultDB is the embedded SQLite store's default path.
const defaultDB = "./rollgate.db"

// RegisterFlags registers --clickhouse, --clickhouse-ttl-days and --db.
func (c *storeConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.ClickHouse, "clickhouse", c.ClickHouse, "ClickHouse DSN, e.g. clickhouse://127.0.0.1:9000/rollgate (empty = embedded store; prefer ROLLGATE_CLICKHOUSE for DSNs with passwords)")
	fs.IntVar(&c.ClickHouseTTLDays, "clickhouse-ttl-days", c.ClickHouseTTLDays, "expire captured rows after N days (ClickHouse >= 19.6; 0 = keep forever)")
	d := *c
	d.setDefaults()
	fs.StringVar(&c.DB, "db", d.DB, "embedded SQLite store path, used when --clickhouse is empty")
}

// setDefaults fills the settings left empty (also by the file) with their defaults.
func (c *storeConfig) setDefaults() { c.DB = cmp.Or(c.DB, defaultDB) }

// queueConfig is the queue: section: the training loop's task queue and
// resources, a SQLite path or a postgres:// DSN (several gateways sharing
// one queue); empty keeps them in the embedded SQLite file (--db), also
// when capturing to ClickHouse.
type queueConfig struct {
	DSN   string        `yaml:"dsn"`
	Lease time.Duration `yaml:"lease"`
}

// RegisterFlags registers --queue and --task-lease.
func (c *queueConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DSN, "queue", c.DSN, "task queue and resources store: a SQLite path or postgres://user@host/db (shared by several gateways; prefer ROLLGATE_QUEUE for DSNs with passwords); empty = the embedded SQLite file (--db)")
	lease := c.Lease
	if lease <= 0 {
		lease = tasks.DefaultLease
	}
	fs.DurationVar(&c.Lease, "task-lease", lease, "how long a dequeued task's lease lasts without a heartbeat (a task's lease_s overrides it)")
}

// otlpConfig is the otlp: section: the OTLP sink's settings, also used by
// the gateway's own tracing.
type otlpConfig struct {
	otlp.Config `yaml:",inline"`
	// GatewaySampleRatio is the fraction of calls without a traceparent for
	// which the gateway sends its own spans (0 = off).
	GatewaySampleRatio float64 `yaml:"gateway_sample_ratio"`
}

// defaultGatewaySampleRatio is --otlp-gateway-sample-ratio's default.
const defaultGatewaySampleRatio = 0.01

// RegisterFlags registers the OTLP sink's flags and --otlp-gateway-sample-ratio.
func (c *otlpConfig) RegisterFlags(fs *flag.FlagSet) {
	c.Config.RegisterFlags(fs)
	fs.Float64Var(&c.GatewaySampleRatio, "otlp-gateway-sample-ratio", defaultGatewaySampleRatio, "the gateway's own spans, sent with --otlp-endpoint (a SERVER span per call: route, model, waits, status; a CLIENT child per backend attempt, each retry its own, with replica, URL, status, error): the fraction 0..1 of calls without a traceparent that are traced (by trace id); a call whose traceparent is sampled is always traced, inside the agent's trace, an unsampled one never; 0 = off (no tracing work at all)")
}

// captureConfig is the capture: section: the pipeline's sizes and the
// write-ahead log's (wal, wal_max_bytes, wal_sync_interval).
type captureConfig struct {
	Pipeline capture.Config    `yaml:",inline"`
	WAL      capture.WALConfig `yaml:",inline"`
	// WALOn logs answered calls to the write-ahead log in the spool folder.
	WALOn bool `yaml:"wal"`
}

// RegisterFlags registers the --capture-* flags.
func (c *captureConfig) RegisterFlags(fs *flag.FlagSet) {
	c.Pipeline.RegisterFlags(fs)
	c.WAL.RegisterFlags(fs)
	fs.BoolVar(&c.WALOn, "capture-wal", true, "with --spool-dir: log every answered call to a write-ahead log in the spool folder (one write(2), before the answer's last bytes) until its rows are stored or spooled, and replay it at the next start, so a killed gateway (SIGKILL, OOM) loses no answered call; false = calls waiting in the capture queue are lost on a kill (without --spool-dir they always are)")
}

// serveFlags are serve's settings that exist as flags (and environment
// variables) only: the config file's path, the one-backend shorthand
// (--upstream: the file has backends:), process settings, and the
// explicit opt-out of the admin token.
type serveFlags struct {
	Config        string
	Upstream      string
	UpstreamKind  string
	Model         string
	PolicyVersion string
	MemoryLimit   string
	GCHeadroom    string
	LogLevel      string
	InsecureAdmin bool
	DebugListen   string
}

// RegisterFlags registers serve's own flags.
func (c *serveFlags) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Config, "config", "", "YAML config file with many models/replicas; every setting in it also has a flag and an environment variable, which override it (flag > environment > file > default)")
	fs.StringVar(&c.Upstream, "upstream", "", "OpenAI base URL of one backend, ending in /v1 (e.g. http://127.0.0.1:8001/v1); empty starts the built-in mock")
	fs.StringVar(&c.UpstreamKind, "upstream-kind", "auto", "backend kind of --upstream: vllm, sglang, llamacpp, openai or auto (probe /version and /v1/models)")
	fs.StringVar(&c.Model, "model", "*", "model name routed to --upstream (\"*\" = every model)")
	fs.StringVar(&c.PolicyVersion, "policy-version", "", "weights version served by --upstream, recorded on every captured row")
	fs.StringVar(&c.MemoryLimit, "memory-limit", "", "soft memory limit for the Go runtime, e.g. 192MiB (as GOMEMLIMIT): the GC works harder near it, bounding peak RSS under many open streams; empty = Go's default (GOMEMLIMIT if set)")
	fs.StringVar(&c.GCHeadroom, "gc-headroom", "48MiB", "most the heap may grow past what the last garbage collection found live (stacks included) before the next one, e.g. 48MiB: a small heap is paced by GOGC as Go does, a large one (thousands of open streams) collects once it has grown by this much instead of doubling: less RSS per open stream for more collections; never less than 25 % of the live heap; 0 = Go's pacing alone (GOGC)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.InsecureAdmin, "insecure-admin", false, "allow --listen (or --debug-listen) on a non-loopback address without ROLLGATE_ADMIN_TOKEN: anyone who reaches the port can then change the routing table, pause the gateway and read every captured rollout")
	fs.StringVar(&c.DebugListen, "debug-listen", "", "serve Go's net/http/pprof profiles on this address (e.g. 127.0.0.1:6060); empty = off")
}

// secureListen refuses a listener beyond loopback without an admin token,
// unless --insecure-admin.
func (c *fileConfig) secureListen() error {
	g := c.Gateway
	g.SetDefaults()
	return requireAdminOffLoopback(c.Gateway.AdminToken, c.Serve.InsecureAdmin,
		"change the routing table, pause the gateway and read every rollout",
		"Set ROLLGATE_ADMIN_TOKEN (and client keys, ROLLGATE_CLIENT_KEYS, for agents)",
		listenFlag{"--listen", g.Listen}, listenFlag{"--debug-listen", c.Serve.DebugListen})
}

// listenFlag is a listen address and the flag that set it.
type listenFlag struct{ flag, addr string }

// requireAdminOffLoopback is the admin-token rule of every rollgate
// listener (serve, bridge --serve): one beyond loopback needs
// ROLLGATE_ADMIN_TOKEN (token) unless insecure (--insecure-admin). exposes
// says what anyone reaching the port could then do, fix how to set a token.
func requireAdminOffLoopback(token string, insecure bool, exposes, fix string, listeners ...listenFlag) error {
	if token != "" || insecure {
		return nil
	}
	for _, a := range listeners {
		if a.addr != "" && !isLoopbackAddr(a.addr) {
			return fmt.Errorf("%s %s is not a loopback address and ROLLGATE_ADMIN_TOKEN is not set: "+
				"anyone who reaches the port could %s. %s, or pass --insecure-admin to accept that", a.flag, a.addr, exposes, fix)
		}
	}
	return nil
}

// readSecrets takes the gateway's secrets from the environment, never from
// a file or a flag: ROLLGATE_ADMIN_TOKEN (then refusing a listener beyond
// loopback without it, see secureListen) and ROLLGATE_CLIENT_KEYS.
func (c *fileConfig) readSecrets() error {
	c.Gateway.AdminToken = os.Getenv("ROLLGATE_ADMIN_TOKEN")
	if err := c.secureListen(); err != nil {
		return err
	}
	if v := os.Getenv("ROLLGATE_CLIENT_KEYS"); v != "" {
		keys, err := gateway.ParseClientKeys(v)
		if err != nil {
			return fmt.Errorf("ROLLGATE_CLIENT_KEYS: %w", err)
		}
		c.Gateway.ClientKeys = append(c.Gateway.ClientKeys, keys...)
	}
	return nil
}

// isLoopbackAddr reports whether a listen address (host:port) only accepts
// connections from this machine: a loopback IP or "localhost". An empty
// host, 0.0.0.0, :: or any other name listens beyond it.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}
