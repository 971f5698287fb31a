package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"gopkg.in/yaml.v3"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/trainer-bridge/tasks"
)

// fileConfig is the YAML config file of "rollgate serve --config".
type fileConfig struct {
	Gateway gateway.Config `yaml:",inline"`
	// AGL serves Agent Lightning v1.0's API gateway routes (controlplane/agl).
	AGL agl.Config `yaml:"agl"`
	// ClickHouse is a DSN (clickhouse://host:9000/db); empty uses the embedded store.
	ClickHouse string `yaml:"clickhouse"`
	// ClickHouseTTLDays expires captured rows after this many days on servers
	// that support TTL (0 = keep forever).
	ClickHouseTTLDays int `yaml:"clickhouse_ttl_days"`
	// DB is the embedded SQLite store's path.
	DB string `yaml:"db"`
	// Spool keeps captured rows on local disk while the store is down or slow.
	Spool struct {
		Dir          string        `yaml:"dir"`
		MaxBytes     int64         `yaml:"max_bytes"`
		FullPolicy   string        `yaml:"full_policy"`
		SyncInterval time.Duration `yaml:"sync_interval"`
	} `yaml:"spool"`
	// OTLP exports every captured call as an OpenTelemetry span (GenAI
	// semantic conventions), and the gateway's own spans; off unless
	// otlp.endpoint is set.
	OTLP otlpConfig `yaml:"otlp"`
	// Queue is the training loop's task queue and resources: a SQLite path or
	// a postgres:// DSN (several gateways sharing one queue); empty keeps them
	// in the embedded SQLite file (--db), also when capturing to ClickHouse.
	Queue struct {
		DSN   string        `yaml:"dsn"`
		Lease time.Duration `yaml:"lease"`
	} `yaml:"queue"`
	// Redact rewrites stored text before it reaches any store (secrets, PII
	// in prompts); token ids and what the client receives are untouched.
	Redact []capture.RedactRule `yaml:"redact"`
	// Capture sizes the capture pipeline.
	Capture struct {
		QueueSize     int           `yaml:"queue_size"`
		QueueBytes    int           `yaml:"queue_bytes"`
		Workers       int           `yaml:"workers"`
		BatchSize     int           `yaml:"batch_size"`
		BatchBytes    int           `yaml:"batch_bytes"`
		FlushInterval time.Duration `yaml:"flush_interval"`
	} `yaml:"capture"`
}

// yamlHas reports whether the YAML config file at path sets the top-level
// key (so that a flag's default does not override what the file says).
func yamlHas(path, key string) bool {
	if path == "" {
		return false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var m map[string]any
	if yaml.Unmarshal(b, &m) != nil {
		return false
	}
	_, ok := m[key]
	return ok
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

// otlpConfig is the otlp: section of the config file: the OTLP sink's
// settings, also used by the gateway's own tracing.
type otlpConfig struct {
	otlp.Config `yaml:",inline"`
	// GatewaySampleRatio is the fraction of calls without a traceparent for
	// which the gateway sends its own spans (see --otlp-gateway-sample-ratio;
	// absent = the flag's default, 0 = off).
	GatewaySampleRatio *float64 `yaml:"gateway_sample_ratio"`
}

// defaultGatewaySampleRatio is --otlp-gateway-sample-ratio's default.
const defaultGatewaySampleRatio = 0.01

const serveSummary = `rollgate serve — run the gateway.

Agents point OPENAI_BASE_URL at http://LISTEN/v1, or at
http://LISTEN/rollout/{rollout_id}/attempt/{attempt_id}/v1 to attribute calls to a rollout.
One backend: --upstream http://host:8000/v1. Many models/replicas: --config rollgate.yaml
(see deploy/rollgate.example.yaml). Without --upstream or backends in the config, the
built-in mock vLLM engine is started on loopback so you can try everything at once.`

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve", serveSummary, stdout)
	var (
		configPath     = fs.String("config", "", "YAML config file with many models/replicas (flags given explicitly override it)")
		listen         = fs.String("listen", "127.0.0.1:8000", "address to serve on")
		publicURL      = fs.String("public-url", "", "base URL agents reach the gateway at, used in returned base_url (default http://LISTEN)")
		upstream       = fs.String("upstream", "", "OpenAI base URL of one backend, ending in /v1 (e.g. http://127.0.0.1:8001/v1); empty starts the built-in mock")
		upstreamKind   = fs.String("upstream-kind", "auto", "backend kind of --upstream: vllm, sglang, llamacpp, openai or auto (probe /version and /v1/models)")
		model          = fs.String("model", "*", "model name routed to --upstream (\"*\" = every model)")
		policyVersion  = fs.String("policy-version", "", "weights version served by --upstream, recorded on every captured row")
		clickhouseDSN  = fs.String("clickhouse", "", "ClickHouse DSN, e.g. clickhouse://127.0.0.1:9000/rollgate (empty = embedded store; prefer ROLLGATE_CLICKHOUSE for DSNs with passwords)")
		ttlDays        = fs.Int("clickhouse-ttl-days", 0, "expire captured rows after N days (ClickHouse >= 19.6; 0 = keep forever)")
		dbPath         = fs.String("db", "./rollgate.db", "embedded SQLite store path, used when --clickhouse is empty")
		injectLogprobs = fs.Bool("inject-logprobs", true, "ask vLLM, SGLang and llama.cpp (chat) engines for the sampled tokens' logprobs (no alternatives) when the client did not, for training (rollout_log_probs); stripped from the client's copy; false = off (the bridge then excludes samples without logprobs as no_logprobs unless --logprobs omit)")
		maxBody        = fs.Int("max-body-bytes", 32<<20, "largest request body accepted; larger ones get 413")
		timeout        = fs.Duration("upstream-timeout", 10*time.Minute, "longest a backend call may take, stream included; 504 if nothing was sent by then")
		queueSize      = fs.Int("capture-queue", 8192, "calls that may wait for capture; when full, calls are dropped from capture and counted (rollgate_capture_dropped_total)")
		queueBytes     = fs.Int("capture-queue-bytes", 256<<20, "memory the calls waiting for capture may hold (bodies, token ids); past it calls are dropped from capture and counted, as for --capture-queue")
		fwdAuth        = fs.Bool("forward-client-authorization", false, "pass the agent's Authorization header to backends that have no key of their own (default: the gateway holds upstream credentials)")
		retries        = fs.Int("retries", 2, "times a call that failed before any response byte is retried on another replica (-1 = never)")
		routing        = fs.String("routing", gateway.RoutingAffine, "how a model's replicas share calls, for pools whose config sets no routing: affine (the calls of one rollout go to one replica while it is healthy and under the load bound, so the engine's prefix cache serves every turn after the first; calls without a rollout id go to the least loaded) or least_outstanding (every call to the least loaded replica); see also --routing-load-factor")
		loadFactor     = fs.Float64("routing-load-factor", gateway.DefaultRoutingLoadFactor, "affine routing's load bound c >= 1: a replica holding ceil(c x average outstanding calls) or more is passed over for the rollout's next replica; larger keeps rollouts on their replica under more imbalance")
		spoolDir       = fs.String("spool-dir", "", "durable spool folder: captured rows wait here (checksummed, replayed in order) while the store is down or slow; empty = no spool (rows are dropped, counted, after retries)")
		spoolMax       = fs.Int64("spool-max-bytes", 1<<30, "largest size of the spool")
		spoolPolicy    = fs.String("spool-full-policy", "block", "when the spool is full: block (capture waits) or drop (rows dropped and counted in rollgate_spool_dropped_rows_total)")
		spoolSync      = fs.Duration("spool-sync-interval", 0, "fsync the spool at this interval instead of on every batch (0); an OS crash can lose up to one interval, a killed process loses nothing written")
		walOn          = fs.Bool("capture-wal", true, "with --spool-dir: log every answered call to a write-ahead log in the spool folder (one write(2), before the answer's last bytes) until its rows are stored or spooled, and replay it at the next start, so a killed gateway (SIGKILL, OOM) loses no answered call; false = calls waiting in the capture queue are lost on a kill (without --spool-dir they always are)")
		walMax         = fs.Int64("capture-wal-max-bytes", 512<<20, "largest size of the capture write-ahead log; when full, answered calls are captured unlogged (a kill before they are stored loses them) and counted in rollgate_capture_wal_skipped_total{reason=\"full\"}")
		walSync        = fs.Duration("capture-wal-sync-interval", time.Second, "fsync the capture write-ahead log at this interval when it has new records (0 = never): a killed process loses nothing either way; an OS crash or power loss can lose the calls answered in the last interval")
		otlpEndpoint   = fs.String("otlp-endpoint", "", "export captured calls as OpenTelemetry spans to this OTLP receiver (host:port or URL); empty = off")
		otlpProtocol   = fs.String("otlp-protocol", "http", "OTLP protocol: http or grpc")
		otlpHeaders    = fs.String("otlp-headers", "", "extra OTLP headers, k=v,k=v (prefer ROLLGATE_OTLP_HEADERS for tokens)")
		otlpInsecure   = fs.Bool("otlp-insecure", false, "plain-text gRPC / http:// without TLS")
		otlpGwRatio    = fs.Float64("otlp-gateway-sample-ratio", defaultGatewaySampleRatio, "the gateway's own spans, sent with --otlp-endpoint (a SERVER span per call: route, model, waits, status; a CLIENT child per backend attempt, each retry its own, with replica, URL, status, error): the fraction 0..1 of calls without a traceparent that are traced (by trace id); a call whose traceparent is sampled is always traced, inside the agent's trace, an unsampled one never; 0 = off (no tracing work at all)")
		maxConc        = fs.Int("max-concurrency", 0, "most LLM calls in progress at once; more wait up to --queue-timeout, then get 429 (0 = no limit)")
		queueTimeout   = fs.Duration("queue-timeout", 10*time.Second, "how long a call waits for a free slot under --max-concurrency")
		tlsCert        = fs.String("tls-cert", "", "serve HTTPS with this certificate (PEM); needs --tls-key")
		tlsKey         = fs.String("tls-key", "", "private key (PEM) for --tls-cert")
		queueDSN       = fs.String("queue", "", "task queue and resources store: a SQLite path or postgres://user@host/db (shared by several gateways; prefer ROLLGATE_QUEUE for DSNs with passwords); empty = the embedded SQLite file (--db)")
		taskLease      = fs.Duration("task-lease", time.Minute, "how long a dequeued task's lease lasts without a heartbeat (a task's lease_s overrides it)")
		clientRead     = fs.Duration("client-read-timeout", time.Minute, "longest a client may take to send one request, headers and body (bounds slowloris)")
		clientWrite    = fs.Duration("client-write-timeout", time.Minute, "longest a client may leave a response (or one write of a stream) unread before it is disconnected and its backend call cancelled")
		clientIdle     = fs.Duration("client-idle-timeout", 2*time.Minute, "close keep-alive client connections idle this long")
		detokCheck     = fs.String("detok-check", "", "decode each call's output ids and compare them with the returned text, off the hot path: engine (the vLLM replica's /detokenize) or a tokenizer.json path; empty = off")
		memLimit       = fs.String("memory-limit", "", "soft memory limit for the Go runtime, e.g. 192MiB (as GOMEMLIMIT): the GC works harder near it, bounding peak RSS under many open streams; empty = Go's default (GOMEMLIMIT if set)")
		logLevel       = fs.String("log-level", "info", "debug, info, warn or error")
		insecureAdmin  = fs.Bool("insecure-admin", false, "allow --listen (or --debug-listen) on a non-loopback address without ROLLGATE_ADMIN_TOKEN: anyone who reaches the port can then change the routing table, pause the gateway and read every captured rollout")
		debugListen    = fs.String("debug-listen", "", "serve Go's net/http/pprof profiles on this address (e.g. 127.0.0.1:6060); empty = off")
	)
	seqFlags := addSequenceFlags(fs)
	viewer := registerUIFlags(fs)
	aglFlags := addAGLFlags(fs)
	set, err := parseWithEnv(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 2
	}
	log := newLogger(stderr, *logLevel)
	if *memLimit != "" {
		n, err := parseBytes(*memLimit)
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve: --memory-limit:", err)
			return 2
		}
		debug.SetMemoryLimit(n)
	}

	var fc fileConfig
	if *configPath != "" {
		b, err := os.ReadFile(*configPath)
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve: reading config:", err)
			return 2
		}
		if err := yaml.Unmarshal(b, &fc); err != nil {
			fmt.Fprintf(stderr, "rollgate serve: parsing %s: %v\n", *configPath, err)
			return 2
		}
	}
	cfg := fc.Gateway
	if set["listen"] || cfg.Listen == "" {
		cfg.Listen = *listen
	}
	if set["public-url"] {
		cfg.PublicURL = *publicURL
	}
	if set["inject-logprobs"] || !yamlHas(*configPath, "inject_logprobs") {
		cfg.InjectLogprobs = *injectLogprobs
	}
	if set["max-body-bytes"] || cfg.MaxRequestBodyBytes == 0 {
		cfg.MaxRequestBodyBytes = *maxBody
	}
	if set["upstream-timeout"] || cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = *timeout
	}
	if set["forward-client-authorization"] {
		cfg.ForwardClientAuthorization = *fwdAuth
	}
	if set["client-read-timeout"] || cfg.ClientReadTimeout == 0 {
		cfg.ClientReadTimeout = *clientRead
	}
	if set["client-write-timeout"] || cfg.ClientWriteTimeout == 0 {
		cfg.ClientWriteTimeout = *clientWrite
	}
	if set["client-idle-timeout"] || cfg.ClientIdleTimeout == 0 {
		cfg.ClientIdleTimeout = *clientIdle
	}
	if set["detok-check"] {
		cfg.DetokCheck = *detokCheck
	}
	if set["retries"] || cfg.Retries == 0 {
		cfg.Retries = *retries
	}
	if set["routing"] || cfg.Routing == "" {
		cfg.Routing = *routing
	}
	if set["routing-load-factor"] || cfg.RoutingLoadFactor == 0 {
		cfg.RoutingLoadFactor = *loadFactor
	}
	cfg.AdminToken = os.Getenv("ROLLGATE_ADMIN_TOKEN")
	if cfg.AdminToken == "" && !*insecureAdmin {
		for _, a := range []struct{ flag, addr string }{{"--listen", cfg.Listen}, {"--debug-listen", *debugListen}} {
			if a.addr != "" && !isLoopbackAddr(a.addr) {
				fmt.Fprintf(stderr, "rollgate serve: %s %s is not a loopback address and ROLLGATE_ADMIN_TOKEN is not set: "+
					"anyone who reaches the port could change the routing table, pause the gateway and read every rollout. "+
					"Set ROLLGATE_ADMIN_TOKEN (and client keys, ROLLGATE_CLIENT_KEYS, for agents), or pass --insecure-admin to accept that.\n", a.flag, a.addr)
				return 2
			}
		}
	}
	if v := os.Getenv("ROLLGATE_CLIENT_KEYS"); v != "" {
		keys, err := gateway.ParseClientKeys(v)
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve: ROLLGATE_CLIENT_KEYS:", err)
			return 2
		}
		cfg.ClientKeys = append(cfg.ClientKeys, keys...)
	}
	if set["max-concurrency"] {
		cfg.MaxConcurrency = *maxConc
	}
	if set["queue-timeout"] {
		cfg.QueueTimeout = *queueTimeout
	}
	if set["tls-cert"] {
		cfg.TLSCertFile = *tlsCert
	}
	if set["tls-key"] {
		cfg.TLSKeyFile = *tlsKey
	}
	if set["clickhouse"] || fc.ClickHouse == "" {
		fc.ClickHouse = *clickhouseDSN
	}
	if set["clickhouse-ttl-days"] {
		fc.ClickHouseTTLDays = *ttlDays
	}
	if set["db"] || fc.DB == "" {
		fc.DB = *dbPath
	}
	if set["spool-dir"] || fc.Spool.Dir == "" {
		fc.Spool.Dir = *spoolDir
	}
	if set["spool-max-bytes"] || fc.Spool.MaxBytes == 0 {
		fc.Spool.MaxBytes = *spoolMax
	}
	if set["spool-full-policy"] || fc.Spool.FullPolicy == "" {
		fc.Spool.FullPolicy = *spoolPolicy
	}
	if set["spool-sync-interval"] {
		fc.Spool.SyncInterval = *spoolSync
	}
	if set["otlp-endpoint"] {
		fc.OTLP.Endpoint = *otlpEndpoint
	}
	if set["otlp-protocol"] || fc.OTLP.Protocol == "" {
		fc.OTLP.Protocol = *otlpProtocol
	}
	if set["otlp-headers"] {
		fc.OTLP.Headers = map[string]string{}
		for _, kv := range strings.Split(*otlpHeaders, ",") {
			if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k != "" {
				fc.OTLP.Headers[k] = v
			}
		}
	}
	if set["otlp-insecure"] {
		fc.OTLP.Insecure = *otlpInsecure
	}
	gwRatio, gwRatioAsked := *otlpGwRatio, set["otlp-gateway-sample-ratio"]
	if !gwRatioAsked && fc.OTLP.GatewaySampleRatio != nil {
		gwRatio, gwRatioAsked = *fc.OTLP.GatewaySampleRatio, true
	}
	if !(gwRatio >= 0 && gwRatio <= 1) {
		fmt.Fprintf(stderr, "rollgate serve: --otlp-gateway-sample-ratio %v: want a fraction from 0 (off) to 1 (every call)\n", gwRatio)
		return 2
	}
	if gwRatio > 0 && gwRatioAsked && !fc.OTLP.Enabled() {
		fmt.Fprintln(stderr, "rollgate serve: --otlp-gateway-sample-ratio needs --otlp-endpoint (where the spans go); set --otlp-gateway-sample-ratio 0 or an endpoint")
		return 2
	}
	if set["queue"] || fc.Queue.DSN == "" {
		fc.Queue.DSN = *queueDSN
	}
	if set["task-lease"] || fc.Queue.Lease == 0 {
		fc.Queue.Lease = *taskLease
	}
	if set["capture-queue"] || fc.Capture.QueueSize == 0 {
		fc.Capture.QueueSize = *queueSize
	}
	if set["capture-queue-bytes"] || fc.Capture.QueueBytes == 0 {
		fc.Capture.QueueBytes = *queueBytes
	}

	var mockSrv *mock.Server
	if *upstream != "" {
		r := gateway.Replica{URL: *upstream, Kind: *upstreamKind, PolicyVersion: *policyVersion}
		if os.Getenv("ROLLGATE_UPSTREAM_API_KEY") != "" {
			r.APIKeyEnv = "ROLLGATE_UPSTREAM_API_KEY"
		}
		cfg.Backends = append(cfg.Backends, gateway.Backend{Model: *model, Replicas: []gateway.Replica{r}})
	} else if len(cfg.Backends) == 0 {
		s, base, err := mock.Start(mock.Config{})
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve: starting the built-in mock engine:", err)
			return 1
		}
		mockSrv = s
		cfg.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "mock", URL: base, Kind: "vllm", PolicyVersion: *policyVersion}}}}
		fmt.Fprintf(stderr, "no --upstream given: started the built-in mock vLLM engine at %s (model %q; any model name is answered)\n", base, "mock-model")
	}

	ctx := context.Background()
	sc, err := openStore(ctx, fc.ClickHouse, fc.DB, fc.Spool.Dir != "", clickhouse.Options{TTLDays: fc.ClickHouseTTLDays, Logger: log}, log)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve: opening store:", err)
		return 1
	}
	store := sc.Store
	m := metrics.New()
	sink := capture.NamedSink{Name: store.Name(), Sink: store}
	var sp *spool.Spool
	var wal *capture.WAL
	if fc.Spool.Dir != "" {
		sp, err = spool.New(spool.Config{Dir: filepath.Join(fc.Spool.Dir, store.Name()), MaxBytes: fc.Spool.MaxBytes,
			FullPolicy: spool.FullPolicy(fc.Spool.FullPolicy), SyncInterval: fc.Spool.SyncInterval}, store, store.Name(), m.Registry, log)
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve: opening the spool:", err)
			return 1
		}
		sink.Sink = sp
		sc.spool.Store(sp)
		if *walOn { // after the spool: its lock keeps other processes out of the folder
			wal, err = capture.OpenWAL(capture.WALConfig{Dir: filepath.Join(fc.Spool.Dir, "wal"), MaxBytes: *walMax, SyncInterval: *walSync}, m.Registry, log)
			if err != nil {
				fmt.Fprintln(stderr, "rollgate serve: opening the capture write-ahead log (or pass --capture-wal=false):", err)
				return 1
			}
			sc.wal.Store(wal)
		}
	}
	sinks := []capture.NamedSink{sink}
	var otl *otlp.Sink
	if fc.OTLP.Enabled() {
		fc.OTLP.Backends = map[string]string{}
		for _, b := range cfg.Backends {
			for _, r := range b.Replicas {
				n := r.Name
				if n == "" {
					n = r.URL
				}
				fc.OTLP.Backends[n] = r.URL
			}
		}
		fc.OTLP.ParentSpanID = func(c *export.Call) string { return c.ParentSpanID }
		if otl, err = otlp.New(ctx, fc.OTLP.Config); err != nil {
			fmt.Fprintln(stderr, "rollgate serve: OTLP export:", err)
			return 2
		}
		sinks = append(sinks, capture.NamedSink{Name: otl.Name(), Sink: otl})
		if gwRatio > 0 {
			if cfg.Tracing, err = newGatewayTracing(ctx, fc.OTLP.Config, gwRatio, log); err != nil {
				fmt.Fprintln(stderr, "rollgate serve:", err)
				return 2
			}
		}
	}
	var redact *capture.Redactor
	if len(fc.Redact) > 0 {
		if redact, err = capture.NewRedactor(fc.Redact); err != nil {
			fmt.Fprintln(stderr, "rollgate serve:", err)
			return 2
		}
	}
	pipe := capture.NewPipeline(capture.Config{
		QueueSize: fc.Capture.QueueSize, QueueBytes: fc.Capture.QueueBytes, Workers: fc.Capture.Workers,
		BatchSize: fc.Capture.BatchSize, BatchBytes: fc.Capture.BatchBytes, FlushInterval: fc.Capture.FlushInterval, Redact: redact,
		WAL: wal,
	}, sinks, m, log)
	seqs, err := openSequenceStore(ctx, fc.Queue.DSN, fc.DB, seqFlags, seqstore.Options{Registerer: m.Registry, Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 1
	}
	defer seqs.Close() // after the gateway's shutdown: the last calls may reserve
	cfg.SequenceStore = seqs
	seqFlags.apply(set, &cfg)
	srv, err := gateway.New(cfg, pipe, m, log)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 2
	}
	srv.SetStoreStatus(sc.status)
	cp := controlplane.New(controlplane.ConfigOf(cfg), srv, store, pipe, m, log)
	srv.SetControlPlane(cp)
	if err := viewer.mount(srv, store, cfg.AdminToken, log); err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 2
	}
	pipe.SetFallback(srv.FallbackFor)
	pipe.SetDetok(srv.DetokFor)
	go func() {
		if err := pipe.ReplayWAL(); err != nil {
			log.Error("replaying the capture write-ahead log; its records stay for the next start", "err", err)
		}
	}()
	tq, err := openTaskQueue(ctx, fc.Queue.DSN, fc.DB, fc.Queue.Lease, store)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 1
	}
	defer tq.Close()
	cp.SetTaskQueue(tq, time.Second)
	if err := mountAGL(fc.AGL.Merge(aglFlags, set), !isLoopbackAddr(cfg.Listen) && !*insecureAdmin, srv, cp, tq, store, pipe, log); err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 2
	}
	where := "embedded store " + fc.DB
	if fc.ClickHouse != "" {
		where = "ClickHouse " + redactDSN(fc.ClickHouse)
	}
	cfg.SetDefaults()
	fmt.Fprintf(stderr, "rollgate listening on http://%s (OPENAI_BASE_URL=%s/v1), capturing to %s\n", cfg.Listen, cfg.PublicURL, where)

	if *debugListen != "" {
		if err := servePprof(*debugListen, log); err != nil {
			fmt.Fprintln(stderr, "rollgate serve:", err)
			return 2
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	select {
	case err := <-errc:
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve:", err)
			code = 1
		}
	case s := <-sig:
		log.Info("shutting down: draining in-flight calls and flushing capture", "signal", s.String())
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cp.Close() // ends long polls and the lease sweep before the drain
	if err := srv.Shutdown(sctx); err != nil {
		log.Error("shutdown", "err", err)
	}
	if err := pipe.Close(sctx); err != nil {
		log.Error("flushing capture", "err", err)
		code = 1
	}
	if otl != nil {
		if err := otl.Close(sctx); err != nil {
			log.Error("closing OTLP export", "err", err)
		}
	}
	if cfg.Tracing != nil {
		if err := cfg.Tracing.Shutdown(sctx); err != nil {
			log.Error("closing the gateway's tracing", "err", err)
		}
	}
	if sp != nil {
		dctx, dcancel := context.WithTimeout(sctx, 5*time.Second)
		if err := sp.Drain(dctx); err != nil {
			log.Warn("spool not drained before exit; its rows stay on disk and are replayed at the next start", "err", err)
		}
		dcancel()
		if err := sp.Close(sctx); err != nil {
			log.Error("closing spool", "err", err)
		}
	}
	if err := store.Close(); err != nil {
		log.Error("closing store", "err", err)
	}
	if mockSrv != nil {
		_ = mockSrv.Shutdown()
	}
	return code
}

// newGatewayTracing sends the gateway's own spans to the OTLP endpoint of
// cfg, sampled at ratio; export failures are logged (the spans are dropped).
func newGatewayTracing(ctx context.Context, cfg otlp.Config, ratio float64, log *slog.Logger) (*gateway.Tracing, error) {
	exp, err := otlp.NewExporter(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("gateway tracing: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("OpenTelemetry error in the gateway's tracing (spans of a failed export are dropped)", "endpoint", cfg.Endpoint, "err", err)
	}))
	tr, err := gateway.NewTracing(exp, gateway.TracingOptions{SampleRatio: ratio, ServiceName: cfg.ServiceName})
	if err != nil {
		return nil, err
	}
	log.Info("gateway tracing on", "endpoint", cfg.Endpoint, "protocol", cfg.Protocol, "sample_ratio", ratio)
	return tr, nil
}

// openTaskQueue opens the task queue: on dsn when given, else in the
// embedded store's SQLite file (sharing its handle when that is the store).
func openTaskQueue(ctx context.Context, dsn, dbPath string, lease time.Duration, store export.Store) (*tasks.Queue, error) {
	opt := tasks.Options{Lease: lease}
	if dsn == "" {
		if s, ok := store.(interface{ DB() *sql.DB }); ok {
			q, err := tasks.New(ctx, s.DB(), tasks.SQLite, opt)
			if err != nil {
				return nil, fmt.Errorf("task queue in %s: %w", dbPath, err)
			}
			return q, nil
		}
		dsn = dbPath
	}
	q, err := tasks.Open(ctx, dsn, opt)
	if err != nil {
		return nil, fmt.Errorf("opening the task queue: %w", err)
	}
	return q, nil
}

// parseBytes reads a size: a number with an optional B, KiB, MiB, GiB (or
// KB, MB, GB, powers of 1000) suffix.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || v*mult > math.MaxInt64 {
		return 0, fmt.Errorf("%q is not a size like 192MiB", s)
	}
	return int64(v * mult), nil
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// redactDSN hides a password in a DSN for logs.
func redactDSN(dsn string) string {
	at := strings.LastIndex(dsn, "@")
	scheme := strings.Index(dsn, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return dsn
	}
	userinfo := dsn[scheme+3 : at]
	if i := strings.IndexByte(userinfo, ':'); i >= 0 {
		return dsn[:scheme+3] + userinfo[:i] + ":***" + dsn[at:]
	}
	return dsn
}
