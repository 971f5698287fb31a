package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/internal/config"
)

// serveFlagSet is serve's flag set bound to a fresh configuration.
func serveFlagSet() (*fileConfig, *flag.FlagSet) {
	c := &fileConfig{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.registerFlags(fs)
	return c, fs
}

// TestServeFlagsKept: every flag serve had before its settings moved into
// the components' RegisterFlags keeps its name and default (the contract:
// flags and their ROLLGATE_* variables are public).
func TestServeFlagsKept(t *testing.T) {
	kept := map[string]string{
		"capture-queue": "8192", "capture-queue-bytes": "268435456", "capture-wal": "true",
		"capture-wal-max-bytes": "536870912", "capture-wal-sync-interval": "1s", "clickhouse": "",
		"clickhouse-ttl-days": "0", "client-idle-timeout": "2m0s", "client-read-timeout": "1m0s",
		"client-write-timeout": "1m0s", "config": "", "db": "./rollgate.db", "debug-listen": "",
		"detok-check": "", "forward-client-authorization": "false", "inject-logprobs": "true",
		"insecure-admin": "false", "listen": "127.0.0.1:8000", "log-level": "info",
		"max-body-bytes": "33554432", "max-concurrency": "0", "memory-limit": "", "gc-headroom": "48MiB", "model": "*",
		"otlp-endpoint": "", "otlp-gateway-sample-ratio": "0.01", "otlp-headers": "",
		"otlp-insecure": "false", "otlp-protocol": "http", "policy-version": "", "public-url": "",
		"queue": "", "queue-timeout": "10s", "retries": "2", "routing": "affine",
		"routing-load-factor": "1.25", "sequence-retention": "0s", "sequence-timeout": "5s", "sequence-lease": "4s",
		"spool-dir": "", "spool-full-policy": "block", "spool-max-bytes": "1073741824",
		"spool-sync-interval": "0s", "task-lease": "1m0s", "tls-cert": "", "tls-key": "",
		"upstream": "", "upstream-kind": "auto", "upstream-timeout": "10m0s", "ui": "true", "ui-tokenizer": "",
		"agl": "false", "agl-key": "", "agl-model-name": "", "agl-train-temperature": "", "agl-val-temperature": "",
		"agl-include-log-probs": "", "agl-force": "",
	}
	_, fs := serveFlagSet()
	for name, def := range kept {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("--%s is gone", name)
			continue
		}
		if f.DefValue != def {
			t.Errorf("--%s default %q, was %q", name, f.DefValue, def)
		}
	}
}

// TestEveryFileSettingHasAFlag walks the YAML keys of serve's config file:
// every scalar is bound to a flag (and so to an environment variable), so
// a setting added to any component's Config without a flag fails here.
// Lists and maps of structures are the file's only.
func TestEveryFileSettingHasAFlag(t *testing.T) {
	fileOnly := map[string]bool{"backends": true, "client_keys": true, "upstream_keys": true, "redact": true,
		"force": true, "force_modes": true}
	// A flag is named after its key (section as prefix, "_" as "-"), but
	// for these older names (README, "Configuration").
	older := map[string]string{"max_request_body_bytes": "max-body-bytes", "capture.queue_size": "capture-queue",
		"queue.dsn": "queue", "queue.lease": "task-lease", "sequence_store_timeout": "sequence-timeout",
		"tls_cert_file": "tls-cert", "tls_key_file": "tls-key", "agl.enabled": "agl"}
	c, fs := serveFlagSet()
	flags := config.FlagsOf(fs)
	seen, paths := map[string]bool{}, map[string]bool{}
	for _, s := range config.Settings(c) {
		if paths[s.Path] {
			t.Errorf("two fields decode key %s (inlined structs share it)", s.Path)
		}
		paths[s.Path] = true
		f := flags[s.Value.Addr().Pointer()]
		switch {
		case f != nil:
			seen[f.Name] = true
			want := strings.NewReplacer(".", "-", "_", "-").Replace(s.Path)
			if o, ok := older[s.Path]; ok {
				want = o
			}
			if f.Name != want {
				t.Errorf("setting %s has flag --%s; name it --%s", s.Path, f.Name, want)
			}
		case !s.Scalar() && fileOnly[s.Path]:
		case s.Scalar():
			t.Errorf("setting %s has no flag: register one in its component's RegisterFlags", s.Path)
		default:
			t.Errorf("setting %s is a list or map without a flag: give it one, or add it to fileOnly and the README", s.Path)
		}
	}
	for path := range fileOnly {
		found := false
		for _, s := range config.Settings(c) {
			found = found || s.Path == path
		}
		if !found {
			t.Errorf("fileOnly lists %s, which is no setting", path)
		}
	}
	// The converse: a flag is a file setting too, unless it is one of
	// serve's own (serveFlags, documented in the README as flag-only).
	flagOnly := map[string]bool{"config": true, "upstream": true, "upstream-kind": true, "model": true, "policy-version": true,
		"memory-limit": true, "gc-headroom": true, "log-level": true, "insecure-admin": true, "debug-listen": true}
	fs.VisitAll(func(f *flag.Flag) {
		if !seen[f.Name] && !flagOnly[f.Name] {
			t.Errorf("--%s has no key in the config file: bind it to a yaml-tagged field", f.Name)
		}
	})
	if len(seen) < 50 {
		t.Fatalf("only %d flags bound to file settings; the walk lost sections", len(seen))
	}
}

// TestServeConfigPrecedence: serve's settings, through loadServeConfig,
// take the command line over the environment over the file over the
// default: top-level, nested, inline-in-section, bool-defaulting-true, map
// and list settings.
func TestServeConfigPrecedence(t *testing.T) {
	file := `
listen: 127.0.0.1:7001
allowed_hosts: [file.example]
inject_logprobs: false
retries: -1
idle_timeout: 45s
db: ""
sequence_retention: 48h
spool:
  dir: /tmp/spool-file
  max_bytes: 1000
capture:
  queue_size: 10
  wal: false
  wal_sync_interval: 0s
queue:
  lease: 2m
otlp:
  endpoint: collector:4318
  headers: {authorization: file}
  gateway_sample_ratio: 0.5
backends:
  - model: m
    replicas: [{url: "http://127.0.0.1:9/v1"}]
redact:
  - {name: keys, pattern: "sk-[a-z]+"}
`
	type row struct {
		name  string
		env   map[string]string
		args  []string
		check func(c *fileConfig) string
	}
	rows := []row{
		{"defaults", nil, nil, func(c *fileConfig) string {
			return str(c.Gateway.Listen, c.Gateway.InjectLogprobs, c.Gateway.Retries, c.Gateway.IdleTimeout, c.Store.DB,
				c.Sequences.Retention, c.Spool.MaxBytes, c.Capture.Pipeline.QueueSize, c.Capture.WALOn,
				c.Capture.WAL.SyncInterval, c.Queue.Lease, c.OTLP.Endpoint, c.OTLP.GatewaySampleRatio, c.OTLP.Protocol)
		}},
	}
	want := map[string]string{
		"defaults": "127.0.0.1:8000 true 2 2m0s ./rollgate.db 0s 1073741824 8192 true 1s 1m0s  0.01 http",
	}
	withFile := []row{
		{"file", nil, nil, nil},
		{"environment over file", map[string]string{
			"ROLLGATE_LISTEN": "127.0.0.1:7002", "ROLLGATE_INJECT_LOGPROBS": "true", "ROLLGATE_SPOOL_MAX_BYTES": "2000",
			"ROLLGATE_CAPTURE_WAL_SYNC_INTERVAL": "5s", "ROLLGATE_OTLP_HEADERS": "authorization=env", "ROLLGATE_TASK_LEASE": "3m",
			"ROLLGATE_ALLOWED_HOSTS": "env.example, env2.example",
		}, nil, nil},
		{"flag over environment over file", map[string]string{"ROLLGATE_LISTEN": "127.0.0.1:7002", "ROLLGATE_SEQUENCE_RETENTION": "1h", "ROLLGATE_ALLOWED_HOSTS": "env.example"},
			[]string{"--listen", "127.0.0.1:7003", "--sequence-retention", "2h", "--capture-wal", "--otlp-headers", "authorization=flag", "--idle-timeout", "1s",
				"--allowed-hosts", "flag.example"}, nil},
	}
	fileWant := map[string]string{
		"file":                            "127.0.0.1:7001 false -1 45s ./rollgate.db 48h0m0s 1000 10 false 0s 2m0s collector:4318 0.5 http map[authorization:file] [file.example]",
		"environment over file":           "127.0.0.1:7002 true -1 45s ./rollgate.db 48h0m0s 2000 10 false 5s 3m0s collector:4318 0.5 http map[authorization:env] [env.example env2.example]",
		"flag over environment over file": "127.0.0.1:7003 false -1 1s ./rollgate.db 2h0m0s 1000 10 true 0s 2m0s collector:4318 0.5 http map[authorization:flag] [flag.example]",
	}
	path := filepath.Join(t.TempDir(), "rollgate.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(r row, args []string, want string, check func(c *fileConfig) string) {
		t.Run(r.name, func(t *testing.T) {
			for k, v := range r.env {
				t.Setenv(k, v)
			}
			c, _, err := loadServeConfig(args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got := check(c); got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			if len(args) > 0 && args[0] == "--config" && (len(c.Gateway.Backends) != 1 || len(c.Redact) != 1) {
				t.Fatalf("lists from the file: %+v %+v", c.Gateway.Backends, c.Redact)
			}
		})
	}
	for _, r := range rows {
		run(r, r.args, want[r.name], r.check)
	}
	all := func(c *fileConfig) string {
		return str(c.Gateway.Listen, c.Gateway.InjectLogprobs, c.Gateway.Retries, c.Gateway.IdleTimeout, c.Store.DB,
			c.Sequences.Retention, c.Spool.MaxBytes, c.Capture.Pipeline.QueueSize, c.Capture.WALOn,
			c.Capture.WAL.SyncInterval, c.Queue.Lease, c.OTLP.Endpoint, c.OTLP.GatewaySampleRatio, c.OTLP.Protocol, c.OTLP.Headers, c.Gateway.AllowedHosts)
	}
	for _, r := range withFile {
		run(r, append([]string{"--config", path}, r.args...), fileWant[r.name], all)
	}
}

// str joins values as fmt.Sprint renders each, space-separated.
func str(vs ...any) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, " ")
}

// TestServeConfigChecks: the gateway's own spans need an endpoint only
// when their ratio was asked for (by the file, the environment or a flag);
// its default does not; the ratio is a fraction.
func TestServeConfigChecks(t *testing.T) {
	f := func(yaml string, args []string, want string) {
		t.Helper()
		if yaml != "" {
			p := filepath.Join(t.TempDir(), "c.yaml")
			os.WriteFile(p, []byte(yaml), 0o600)
			args = append(args, "--config", p)
		}
		_, _, err := loadServeConfig(args, io.Discard)
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Fatalf("%q %v: error %v, want %q", yaml, args, err, want)
		}
	}
	f("", nil, "")
	f("otlp: {gateway_sample_ratio: 0.5}\n", nil, "needs --otlp-endpoint")
	f("", []string{"--otlp-gateway-sample-ratio", "0.2"}, "needs --otlp-endpoint")
	f("otlp: {gateway_sample_ratio: 0}\n", nil, "")
	f("", []string{"--otlp-gateway-sample-ratio", "1.5", "--otlp-endpoint", "c:4318"}, "want a fraction")
	f("otlp: {endpoint: c:4318, gateway_sample_ratio: 1}\n", nil, "")
}

// TestListenFromFileDefaultIsLoopback: a file that sets listen empty means
// the default address, which needs no admin token.
func TestListenFromFileDefaultIsLoopback(t *testing.T) {
	t.Setenv("ROLLGATE_ADMIN_TOKEN", "")
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte("listen: \"\"\n"), 0o600)
	c, _, err := loadServeConfig([]string{"--config", p}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.readSecrets(); err != nil {
		t.Fatal(err)
	}
	c.Gateway.Listen = "0.0.0.0:8000"
	if err := c.readSecrets(); err == nil || !strings.Contains(err.Error(), "--insecure-admin") {
		t.Fatalf("a non-loopback listener without a token: %v", err)
	}
}

// TestServeFileKeysKept: every key serve's config file had before its
// settings moved into the components' Config structs still decodes.
func TestServeFileKeysKept(t *testing.T) {
	kept := strings.Fields(`listen public_url max_request_body_bytes max_response_body_bytes upstream_timeout
		idle_timeout client_read_timeout client_write_timeout client_idle_timeout connect_timeout retries
		retry_backoff unhealthy_after unhealthy_cooldown health_interval client_keys tls_cert_file tls_key_file
		max_concurrency queue_timeout pause_max_hold max_tracked_attempts max_tracked_attempt_bytes
		sequence_store_timeout upstream_keys forward_client_authorization disable_tokenize_fallback detok_check
		bridge_lease_ttl inject_logprobs capture_embedding_bodies backends routing routing_load_factor
		clickhouse clickhouse_ttl_days db spool.dir spool.max_bytes spool.full_policy spool.sync_interval
		otlp.endpoint otlp.protocol otlp.headers otlp.insecure otlp.timeout otlp.compression otlp.service_name
		otlp.provider_name otlp.gateway_sample_ratio queue.dsn queue.lease redact capture.queue_size
		capture.queue_bytes capture.workers capture.batch_size capture.batch_bytes capture.flush_interval`)
	c, _ := serveFlagSet()
	have := map[string]bool{}
	for _, s := range config.Settings(c) {
		have[s.Path] = true
	}
	for _, k := range kept {
		if !have[k] {
			t.Errorf("config file key %s is gone", k)
		}
	}
}

// TestGCHeadroomFlag: --gc-headroom takes a size or 0 (Go's pacing alone);
// anything else stops serve before it starts, naming the flag.
func TestGCHeadroomFlag(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "48MiB": 48 << 20, "1GiB": 1 << 30, "100MB": 100e6} {
		if got, err := parseHeadroom(in); err != nil || got != want {
			t.Errorf("parseHeadroom(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"bogus", "-1MiB", "12 parsecs"} {
		if _, err := parseHeadroom(in); err == nil {
			t.Errorf("parseHeadroom(%q) accepted", in)
		}
	}
	var stderr strings.Builder
	if code := run([]string{"serve", "--gc-headroom", "bogus", "--db", filepath.Join(t.TempDir(), "r.db")}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--gc-headroom") {
		t.Fatalf("serve --gc-headroom bogus: exit %d, stderr %q; want 2 naming the flag", code, stderr.String())
	}
}
