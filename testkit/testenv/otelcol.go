package testenv

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// EnvOtelcol names the environment variable holding the path of the
// OpenTelemetry Collector binary the OTLP tests export to, built from
// testkit/testenv/otelcol/builder.yaml by scripts/otelcol (scripts/test sets
// it).
const EnvOtelcol = "ROLLGATE_TEST_OTELCOL"

// Collector is a real OpenTelemetry Collector (OTLP receiver, file exporter)
// running as a child process on loopback.
type Collector struct {
	// HTTP is the OTLP/HTTP receiver's host:port (POST /v1/traces).
	HTTP string
	// GRPC is the OTLP gRPC receiver's host:port.
	GRPC string
	// File is where the file exporter writes what it received, one OTLP JSON
	// export request per line.
	File string

	dir    string
	cmd    *exec.Cmd
	exited chan error
}

// StartCollector runs the collector named by ROLLGATE_TEST_OTELCOL with an
// OTLP receiver on two free loopback ports and a file exporter flushing every
// 100 ms, and waits until both ports accept connections. It is an error, not
// a reason to skip, when the variable is not set.
func StartCollector() (*Collector, error) {
	bin := os.Getenv(EnvOtelcol)
	if bin == "" {
		return nil, fmt.Errorf("%s is not set: run scripts/test (it builds the OpenTelemetry Collector once into ~/.cache/rollgate and sets it), or set it yourself: export %s=$(scripts/otelcol)", EnvOtelcol, EnvOtelcol)
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s=%s: %w (rebuild it with scripts/otelcol)", EnvOtelcol, bin, err)
	}
	var lastErr error
	for range 3 { // a port taken between freePort and the collector's bind: try others
		c, err := startCollector(bin)
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

const collectorConfig = `receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  file:
    path: %s
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
`

func startCollector(bin string) (*Collector, error) {
	dir, err := os.MkdirTemp("", "rollgate-otelcol-")
	if err != nil {
		return nil, fmt.Errorf("otelcol: temp dir: %w", err)
	}
	var ports [2]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	c := &Collector{
		GRPC:   fmt.Sprintf("127.0.0.1:%d", ports[0]),
		HTTP:   fmt.Sprintf("127.0.0.1:%d", ports[1]),
		File:   filepath.Join(dir, "traces.jsonl"),
		dir:    dir,
		exited: make(chan error, 1),
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, collectorConfig, c.GRPC, c.HTTP, c.File), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("otelcol: %w", err)
	}
	logf, err := os.Create(filepath.Join(dir, "collector.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("otelcol: %w", err)
	}
	c.cmd = exec.Command(bin, "--config", cfg)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = sysProcAttr()
	if err := c.cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("otelcol: starting %s: %w", bin, err)
	}
	go func() { c.exited <- c.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(StartTimeout)
	for {
		ready := true
		for _, addr := range []string{c.GRPC, c.HTTP} {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				ready = false
				break
			}
			conn.Close()
		}
		if ready {
			return c, nil
		}
		select {
		case err := <-c.exited:
			c.exited <- err
			log := c.Log()
			c.Stop()
			return nil, fmt.Errorf("otelcol exited before listening: %v\n%s", err, log)
		case <-time.After(50 * time.Millisecond): // polling interval of this wait on the listener
		}
		if time.Now().After(deadline) {
			log := c.Log()
			c.Stop()
			return nil, fmt.Errorf("otelcol did not listen on %s and %s within %s\n%s", c.GRPC, c.HTTP, StartTimeout, log)
		}
	}
}

// Log returns what the collector wrote to stdout and stderr so far.
func (c *Collector) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "collector.log"))
	return string(b)
}

// Stop shuts the collector down (SIGTERM, then SIGKILL after 10s) and removes
// its folder.
func (c *Collector) Stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	os.RemoveAll(c.dir)
}

// Requests reads the export requests the file exporter has written so far.
// The file holds OTLP JSON, whose trace and span ids are hex; they are
// turned into protobuf messages with the ids as bytes.
func (c *Collector) Requests() ([]*coltracepb.ExportTraceServiceRequest, error) {
	b, err := os.ReadFile(c.File)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("otelcol: reading %s: %w", c.File, err)
	}
	var out []*coltracepb.ExportTraceServiceRequest
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || !bytes.HasSuffix(line, []byte("}")) {
			continue // empty, or the last line while it is being written
		}
		var v any
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, fmt.Errorf("otelcol: %s: line is not JSON: %w", c.File, err)
		}
		if err := hexIDsToBase64(v); err != nil {
			return nil, fmt.Errorf("otelcol: %s: %w", c.File, err)
		}
		pj, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("otelcol: %w", err)
		}
		req := new(coltracepb.ExportTraceServiceRequest)
		if err := protojson.Unmarshal(pj, req); err != nil {
			return nil, fmt.Errorf("otelcol: %s: not an OTLP trace export: %w", c.File, err)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("otelcol: reading %s: %w", c.File, err)
	}
	return out, nil
}

// hexIDsToBase64 rewrites the traceId, spanId and parentSpanId fields of
// OTLP JSON (hex, per the OTLP specification) into protobuf JSON's base64.
func hexIDsToBase64(v any) error {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && (k == "traceId" || k == "spanId" || k == "parentSpanId") {
				b, err := hex.DecodeString(s)
				if err != nil {
					return fmt.Errorf("%s %q is not hex: %w", k, s, err)
				}
				x[k] = base64.StdEncoding.EncodeToString(b)
				continue
			}
			if err := hexIDsToBase64(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := hexIDsToBase64(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// String describes the collector for test logs.
func (c *Collector) String() string {
	return strings.Join([]string{"otelcol grpc=" + c.GRPC, "http=" + c.HTTP, "file=" + c.File}, " ")
}
