package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
	"github.com/rollgate/rollgate/internal/gcheadroom"
	"github.com/rollgate/rollgate/internal/metrics"
)

// serving is a started gateway and the parts it stops on shutdown; a nil
// part was not started.
type serving struct {
	log     *slog.Logger
	cfg     gateway.Config
	mock    *mock.Server
	store   *storeConn
	spool   *spool.Spool
	otlp    *otlp.Sink
	pipe    *capture.Pipeline
	seqs    seqstore.Store
	srv     *gateway.Server
	cp      *controlplane.Server
	tasks   *tasks.Queue
	served  chan error // the listener's end
	started bool
	gc      *gcheadroom.Pacer // --gc-headroom; stopped by shutdown
}

// startServe starts every part of the gateway from c, in the order each
// needs the others, and the listener. On error, what was started is stopped.
func startServe(c *fileConfig, stderr io.Writer, log *slog.Logger) (*serving, error) {
	s := &serving{log: log, served: make(chan error, 1)}
	if c.Serve.MemoryLimit != "" {
		n, err := parseBytes(c.Serve.MemoryLimit)
		if err != nil {
			return nil, refused(fmt.Errorf("--memory-limit: %w", err))
		}
		debug.SetMemoryLimit(n)
	}
	headroom, err := parseHeadroom(c.Serve.GCHeadroom)
	if err != nil {
		return nil, refused(fmt.Errorf("--gc-headroom: %w", err))
	}
	if err := c.readSecrets(); err != nil {
		return nil, refused(err)
	}
	s.gc = gcheadroom.Start(headroom)
	if err := s.start(c, stderr); err != nil {
		s.shutdown()
		return nil, err
	}
	return s, nil
}

// start starts the parts of s.
func (s *serving) start(c *fileConfig, stderr io.Writer) error {
	if err := s.routeBackends(c, stderr); err != nil {
		return err
	}
	ctx, m := context.Background(), metrics.New()
	if err := s.openCapture(ctx, c, m); err != nil {
		return err
	}
	var err error
	if s.seqs, err = openSequenceStore(ctx, c.Queue.DSN, c.Store.DB, seqstore.Options{Retention: c.Sequences.Retention, SessionLease: c.Sequences.Lease, Registerer: m.Registry, Logger: s.log}); err != nil {
		return failed(err)
	}
	s.cfg.SequenceStore = s.seqs
	if s.srv, err = gateway.New(s.cfg, s.pipe, m, s.log); err != nil {
		return refused(err)
	}
	s.srv.SetStoreStatus(s.store.status)
	s.cp = controlplane.New(c.ControlPlane.Shared(s.cfg), s.srv, s.store.Store, s.pipe, m, s.log)
	s.srv.SetControlPlane(s.cp)
	if err := c.UI.mount(s.srv, s.store.Store, s.cfg.AdminToken, s.log); err != nil {
		return refused(err)
	}
	go func() {
		if err := s.pipe.ReplayWAL(); err != nil {
			s.log.Error("replaying the capture write-ahead log; its records stay for the next start", "err", err)
		}
	}()
	if s.tasks, err = openTaskQueue(ctx, c.Queue.DSN, c.Store.DB, c.Queue.Lease, s.store.Store); err != nil {
		return failed(err)
	}
	s.cp.SetTaskQueue(s.tasks, time.Second)
	shown := s.cfg
	shown.SetDefaults()
	if err := mountAGL(c.AGL, !isLoopbackAddr(shown.Listen) && !c.Serve.InsecureAdmin, s.srv, s.cp, s.tasks, s.store.Store, s.pipe, s.log); err != nil {
		return refused(err)
	}
	// Bound before "listening" is said: a port in use is the one line.
	ln, err := listen("--listen", shown.Listen)
	if err != nil {
		return failed(err)
	}
	if c.Serve.DebugListen != "" {
		if err := servePprof(c.Serve.DebugListen, s.log); err != nil {
			ln.Close()
			return refused(err)
		}
	}
	where := "embedded store " + c.Store.DB
	if c.Store.ClickHouse != "" {
		where = "ClickHouse " + redactDSN(c.Store.ClickHouse)
	}
	fmt.Fprintf(stderr, "rollgate listening on http://%s (OPENAI_BASE_URL=%s/v1), capturing to %s\n", shown.Listen, shown.PublicURL, where)
	s.started = true
	go func() { s.served <- s.srv.Serve(ln) }()
	go checkUpstreams(s.srv, s.log)
	return nil
}

// upstreamCheckTimeout bounds the start check of each replica.
const upstreamCheckTimeout = 5 * time.Second

// checkUpstreams asks every replica for its model list once at start and
// logs what each serves, or that it did not answer (then /readyz names it
// until a health check or a call succeeds), with a hint when its URL looks
// wrong (no /v1).
func checkUpstreams(srv *gateway.Server, log *slog.Logger) {
	for _, r := range srv.CheckUpstreams(upstreamCheckTimeout) {
		switch {
		case r.OK() && r.Hint == "":
			log.Info("upstream answered", "model_route", r.Model, "url", r.URL, "models", strings.Join(r.Models, ","))
		case r.OK():
			log.Warn("upstream answered, but its URL looks wrong", "model_route", r.Model, "url", r.URL, "models", strings.Join(r.Models, ","), "hint", r.Hint)
		case r.Status == 0:
			log.Warn("upstream unreachable: calls routed to it fail until it answers (GET /readyz lists it in upstreams_unreachable)",
				"model_route", r.Model, "url", r.URL, "checked", r.URL+"/models", "hint", r.Hint)
		default:
			log.Warn("upstream did not list its models: calls routed to it may fail (GET /readyz lists it in upstreams_unreachable)",
				"model_route", r.Model, "url", r.URL, "status", r.Status, "checked", r.URL+"/models", "hint", r.Hint)
		}
	}
}

// routeBackends sets the initial routing table: the file's backends, plus
// --upstream's; with neither, the built-in mock engine's.
func (s *serving) routeBackends(c *fileConfig, stderr io.Writer) error {
	s.cfg = c.Gateway
	f := c.Serve
	if f.Upstream != "" {
		r := gateway.Replica{URL: f.Upstream, Kind: f.UpstreamKind, PolicyVersion: f.PolicyVersion}
		if os.Getenv("ROLLGATE_UPSTREAM_API_KEY") != "" {
			r.APIKeyEnv = "ROLLGATE_UPSTREAM_API_KEY"
		}
		s.cfg.Backends = append(s.cfg.Backends, gateway.Backend{Model: f.Model, Replicas: []gateway.Replica{r}})
		return nil
	}
	if len(s.cfg.Backends) > 0 {
		return nil
	}
	ms, base, err := mock.Start(mock.Config{})
	if err != nil {
		return failed(fmt.Errorf("starting the built-in mock engine: %w", err))
	}
	s.mock = ms
	s.cfg.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "mock", URL: base, Kind: "vllm", PolicyVersion: f.PolicyVersion}}}}
	fmt.Fprintf(stderr, "no --upstream given: started the built-in mock vLLM engine at %s (model %q; any model name is answered)\n", base, "mock-model")
	return nil
}

// openCapture opens the capture store, its spool and write-ahead log, the
// OTLP sink and the gateway's own tracing, and the pipeline feeding them.
func (s *serving) openCapture(ctx context.Context, c *fileConfig, m *metrics.Metrics) error {
	var err error
	chOpt := clickhouse.Options{TTLDays: c.Store.ClickHouseTTLDays, Logger: s.log}
	if c.Spool.Dir != "" {
		if err := spool.CheckDir(c.Spool.Dir); err != nil {
			return failed(fmt.Errorf("--spool-dir: %w", err))
		}
	}
	if s.store, err = openStore(ctx, c.Store.ClickHouse, c.Store.DB, c.Spool.Dir != "", chOpt, s.log); err != nil {
		return failed(fmt.Errorf("opening store: %w", err))
	}
	sink := capture.NamedSink{Name: s.store.Name(), Sink: s.store.Store}
	pc := c.Capture.Pipeline
	// The id fallback and the detokenisation check call the engine of the
	// replica that served each call (package engines).
	if err := pc.UseEngines(s.cfg.DisableTokenizeFallback, s.cfg.DetokCheck); err != nil {
		return refused(fmt.Errorf("gateway: %w (--detok-check)", err))
	}
	if c.Spool.Dir != "" {
		sc := c.Spool
		sc.Dir = filepath.Join(c.Spool.Dir, s.store.Name())
		if s.spool, err = spool.New(sc, s.store.Store, s.store.Name(), m.Registry, s.log); err != nil {
			return failed(fmt.Errorf("opening the spool: %w", err))
		}
		sink.Sink = s.spool
		s.store.spool.Store(s.spool)
		if c.Capture.WALOn { // after the spool: its lock keeps other processes out of the folder
			wc := c.Capture.WAL
			wc.Dir = filepath.Join(c.Spool.Dir, "wal")
			if pc.WAL, err = capture.OpenWAL(wc, m.Registry, s.log); err != nil {
				return failed(fmt.Errorf("opening the capture write-ahead log (or pass --capture-wal=false): %w", err))
			}
			s.store.wal.Store(pc.WAL)
		}
	}
	sinks := []capture.NamedSink{sink}
	if c.OTLP.Enabled() {
		oc := c.OTLP.Config
		oc.Backends = replicaURLs(s.cfg.Backends)
		oc.ParentSpanID = func(c *export.Call) string { return c.ParentSpanID }
		if s.otlp, err = otlp.New(ctx, oc); err != nil {
			return refused(fmt.Errorf("OTLP export: %w", err))
		}
		sinks = append(sinks, capture.NamedSink{Name: s.otlp.Name(), Sink: s.otlp})
		if r := c.gatewayTracing(); r > 0 {
			if s.cfg.Tracing, err = newGatewayTracing(ctx, oc, r, s.log); err != nil {
				return refused(err)
			}
		}
	}
	if len(c.Redact) > 0 {
		if pc.Redact, err = capture.NewRedactor(c.Redact); err != nil {
			return refused(err)
		}
	}
	s.pipe = capture.NewPipeline(pc, sinks, m, s.log)
	return nil
}

// replicaURLs maps each replica's name (its URL when unnamed) to its URL.
func replicaURLs(bs []gateway.Backend) map[string]string {
	out := map[string]string{}
	for _, b := range bs {
		for _, r := range b.Replicas {
			out[cmp.Or(r.Name, r.URL)] = r.URL
		}
	}
	return out
}

// shutdown stops what was started, in order: the control plane's long
// polls, the listener (draining in-flight calls), the capture (flushing
// it), the exporters, the spool, the store, the mock engine and the
// databases. It reports whether the capture was flushed.
func (s *serving) shutdown() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.gc != nil {
		defer s.gc.Stop()
	}
	ok := true
	if s.cp != nil {
		s.cp.Close() // ends long polls and the lease sweep before the drain
	}
	if s.started {
		if err := s.srv.Shutdown(ctx); err != nil {
			s.log.Error("shutdown", "err", err)
		}
	}
	if s.pipe != nil {
		if err := s.pipe.Close(ctx); err != nil {
			s.log.Error("flushing capture", "err", err)
			ok = false
		}
	}
	if s.otlp != nil {
		if err := s.otlp.Close(ctx); err != nil {
			s.log.Error("closing OTLP export", "err", err)
		}
	}
	if s.cfg.Tracing != nil {
		if err := s.cfg.Tracing.Shutdown(ctx); err != nil {
			s.log.Error("closing the gateway's tracing", "err", err)
		}
	}
	if s.spool != nil {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.spool.Drain(dctx); err != nil {
			s.log.Warn("spool not drained before exit; its rows stay on disk and are replayed at the next start", "err", err)
		}
		dcancel()
		if err := s.spool.Close(ctx); err != nil {
			s.log.Error("closing spool", "err", err)
		}
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			s.log.Error("closing store", "err", err)
		}
	}
	if s.mock != nil {
		_ = s.mock.Shutdown()
	}
	if s.tasks != nil {
		s.tasks.Close()
	}
	if s.seqs != nil {
		s.seqs.Close() // after the gateway's shutdown: the last calls may reserve
	}
	return ok
}
