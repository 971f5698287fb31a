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
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/gateway"
)

const serveSummary = `rollgate serve — run the gateway.

Agents point OPENAI_BASE_URL at http://LISTEN/v1, or at
http://LISTEN/rollout/{rollout_id}/attempt/{attempt_id}/v1 to attribute calls to a rollout.
One backend: --upstream http://host:8000/v1. Many models/replicas: --config rollgate.yaml
(see deploy/rollgate.example.yaml). Without --upstream or backends in the config, the
built-in mock vLLM engine is started on loopback so you can try everything at once.
Each setting is taken from its flag, else its environment variable, else the config
file, else its default.`

// runServe runs the gateway until SIGINT or SIGTERM (then drains it) or
// until its listener fails. Exit status 2: a setting serve refuses; 1: a
// part that could not start or a capture that could not be flushed.
func runServe(args []string, stdout, stderr io.Writer) int {
	c, res, err := loadServeConfig(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		return 2
	}
	log := newLogger(stderr, c.Serve.LogLevel)
	for _, k := range res.Unknown {
		log.Warn("the config file sets a key that is no setting; it is ignored (see deploy/rollgate.example.yaml)", "key", k, "file", c.Serve.Config)
	}
	privateFiles()
	s, err := startServe(c, stderr, log)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate serve:", err)
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	code := 0
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-s.served:
		if err != nil {
			fmt.Fprintln(stderr, "rollgate serve:", err)
			code = 1
		}
	case sg := <-sig:
		log.Info("shutting down: draining in-flight calls and flushing capture", "signal", sg.String())
	}
	if !s.shutdown() {
		code = 1
	}
	return code
}

// exitError is an error with serve's exit status.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// refused is a setting serve refuses (exit status 2); failed, a part that
// could not start (1).
func refused(err error) error { return exitError{2, err} }
func failed(err error) error  { return exitError{1, err} }

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

// parseHeadroom reads --gc-headroom: a size like parseBytes's, or 0 (off).
func parseHeadroom(s string) (uint64, error) {
	if t := strings.TrimSpace(s); t == "0" || t == "" {
		return 0, nil
	}
	n, err := parseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%w, or 0 for Go's pacing alone", err)
	}
	return uint64(n), nil
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
