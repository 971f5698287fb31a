package main

// Security drills of the trainer bridge against the real process (issue
// 36, items 7 and 11): the bridge API takes no server path, tokenizer files
// are read with a bound, lease ids are unguessable, and rollgate bridge
// --serve follows serve's admin-token rule.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// jsonPost posts a JSON body (Content-Type: application/json) with an
// optional bearer token and returns the status and body.
func jsonPost(t *testing.T, url, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// leaseIDPattern is a lease id as handed out: 128 random bits in hex.
var leaseIDPattern = regexp.MustCompile(`^lease-[0-9a-f]{32}$`)

// TestBridgeAPITakesNoServerPath: POST /api/v1/bridge/batches "retokenize"
// names a tokenizer of the operator's bridge_tokenizers, never a path.
// Paths that exist, exist as a file, or do not exist all get the same 400
// listing the configured names (main told them apart: "open
// /etc/tokenizer.json: no such file or directory" against "not a
// directory"); a configured name works; a configured folder whose
// tokenizer.json links to /dev/zero is refused without being read (503)
// and the gateway stays up. Lease ids of the gateway's queue are 128 random
// bits, and an ack of a guessed id is 404 naming no lease.
func TestBridgeAPITakesNoServerPath(t *testing.T) {
	qwen := chattemplatetest.ModelDir(t, "qwen2_5")
	zeroDir := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(zeroDir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "rollgate.yaml")
	cfg := "listen: " + addr + "\ndb: " + bridgeStore(t) + "\nbridge_tokenizers:\n  qwen2_5: " + qwen + "\n  zero: " + zeroDir + "\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	_, logs := start(t, addr, "/readyz", "serve", "--config", cfgPath)
	base := "http://" + addr + "/api/v1/bridge"

	var first string
	for _, p := range []string{"/etc", "/etc/passwd", "/nonexistent", "../../../../etc", qwen} {
		status, body := jsonPost(t, base+"/batches", `{"estimator":"none","retokenize":`+jsonString(p)+`}`, "")
		if status != 400 || !strings.Contains(body, `is not a configured tokenizer: use one of qwen2_5, zero (bridge_tokenizers, --bridge-tokenizers)`) {
			t.Errorf("retokenize %q: %d %s, want 400 listing the configured names", p, status, body)
			continue
		}
		for _, leak := range []string{"no such file", "not a directory", "tokenizer.json", "permission denied"} {
			if strings.Contains(body, leak) {
				t.Errorf("retokenize %q: the answer tells about the file system (%q): %s", p, leak, body)
			}
		}
		// The same answer whatever the path is on disk, but for the echoed name.
		if same := body[strings.Index(body, " is not a configured"):]; first == "" {
			first = same
		} else if same != first {
			t.Errorf("retokenize %q answers differently from another path: %s vs %s", p, same, first)
		}
	}
	status, body := jsonPost(t, base+"/batches", `{"estimator":"none","retokenize":"qwen2_5"}`, "")
	var built struct {
		Samples int `json:"samples"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &built) != nil || built.Samples == 0 {
		t.Fatalf("retokenize by configured name: %d %s\n%s", status, body, logs)
	}
	status, body = jsonPost(t, base+"/batches", `{"estimator":"none","retokenize":"zero"}`, "")
	if status != 503 || !strings.Contains(body, "not a regular file but a device") || !strings.Contains(body, "bridge_tokenizers") {
		t.Errorf("a configured tokenizer.json linked to /dev/zero: %d %s", status, body)
	}
	if r, err := http.Get("http://" + addr + "/readyz"); err != nil || r.StatusCode != 200 {
		t.Fatalf("the gateway did not stay up: %v %v\n%s", r, err, logs)
	}

	// Lease ids: 128 random bits; a guessed one is 404 and names no lease.
	status, body = jsonPost(t, base+"/lease", `{"n":1}`, "")
	var l struct {
		LeaseID string `json:"lease_id"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &l) != nil || !leaseIDPattern.MatchString(l.LeaseID) {
		t.Fatalf("lease: %d %s; want a lease_id of lease- and 32 hex digits", status, body)
	}
	for _, guess := range []string{"lease-1", "lease-2", "lease-0"} {
		status, body = jsonPost(t, base+"/ack", `{"lease_id":"`+guess+`"}`, "")
		if status != 404 || strings.Contains(body, l.LeaseID) {
			t.Errorf("ack of the guessed %s: %d %s, want 404 naming no lease", guess, status, body)
		}
	}
	if status, body = jsonPost(t, base+"/ack", `{"lease_id":"`+l.LeaseID+`"}`, ""); status != 200 {
		t.Errorf("ack of the real lease: %d %s", status, body)
	}
}

// TestBridgeRetokenizeFilesBounded: rollgate bridge --retokenize keeps
// taking a folder (the operator's), but a tokenizer.json linked to
// /dev/zero, a FIFO, a sparse file over 64 MiB, and a FIFO as
// tokenizer_config.json or chat_template.jinja are refused with exit 2 and
// an error naming the file and the reason, before anything is read (main
// read /dev/zero until memory ran out and blocked for ever on a FIFO). The
// child runs under ulimit -v, so such a regression fails fast instead of
// taking the machine's memory.
func TestBridgeRetokenizeFilesBounded(t *testing.T) {
	qwen := chattemplatetest.ModelDir(t, "qwen2_5")
	db := bridgeStore(t)
	// folder makes a model folder with qwen's files, name replaced by make.
	folder := func(name string, make func(path string) error) string {
		dir := t.TempDir()
		for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
			abs, err := filepath.Abs(filepath.Join(qwen, f))
			if err != nil {
				t.Fatal(err)
			}
			if f != name {
				if err := os.Symlink(abs, filepath.Join(dir, f)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := make(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	zero := func(p string) error { return os.Symlink("/dev/zero", p) }
	fifo := func(p string) error { return syscall.Mkfifo(p, 0o600) }
	huge := func(p string) error {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Truncate(64<<20 + 1) // hf.MaxFileBytes + 1, sparse: no disk used
	}
	for _, c := range []struct {
		name, file string
		make       func(string) error
		want       string
	}{
		{"tokenizer.json to /dev/zero", "tokenizer.json", zero, "is not a regular file but a device"},
		{"tokenizer.json a FIFO", "tokenizer.json", fifo, "is not a regular file but a named pipe"},
		{"tokenizer.json over 64 MiB", "tokenizer.json", huge, "is 67108865 bytes, over the 67108864-byte limit"},
		{"tokenizer_config.json a FIFO", "tokenizer_config.json", fifo, "is not a regular file but a named pipe"},
		{"chat_template.jinja to /dev/zero", "chat_template.jinja", zero, "is not a regular file but a device"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := folder(c.file, c.make)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "sh", "-c", `ulimit -v 4194304 && exec "$@"`, "sh",
				binary, "bridge", "--db", db, "--out", filepath.Join(t.TempDir(), "b.jsonl"), "--retokenize", dir)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("still running after 30 s (blocked on the file?): %s", out)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--retokenize") ||
				!strings.Contains(string(out), filepath.Join(dir, c.file)) || !strings.Contains(string(out), c.want) {
				t.Fatalf("exit %v, want 2 with an error naming %s and %q:\n%s", err, c.file, c.want, out)
			}
		})
	}
	// The intact folder still works.
	out := filepath.Join(t.TempDir(), "b.jsonl")
	if o, err := exec.Command(binary, "bridge", "--db", db, "--out", out, "--estimator", "none", "--retokenize", qwen).CombinedOutput(); err != nil {
		t.Fatalf("bridge --retokenize on the real folder: %v\n%s", err, o)
	}
}

// TestBridgeServeNeedsAdminToken: rollgate bridge --serve follows serve's
// rule. Off loopback without ROLLGATE_ADMIN_TOKEN it refuses to start
// (exit 2, naming --insecure-admin) unless --insecure-admin; with the token
// every route of the lease API needs Authorization: Bearer (main served
// anyone, anywhere); lease ids are 128 random bits (main: lease-1, lease-2,
// ...) and an ack of a guessed one is 404.
func TestBridgeServeNeedsAdminToken(t *testing.T) {
	db := bridgeStore(t)
	_, port, _ := net.SplitHostPort(freeAddr(t))
	wild := "0.0.0.0:" + port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "bridge", "--db", db, "--serve", wild, "--estimator", "none")
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--serve "+wild+" is not a loopback address") ||
		!strings.Contains(string(out), "--insecure-admin") || !strings.Contains(string(out), "ROLLGATE_ADMIN_TOKEN") {
		t.Fatalf("bridge --serve %s without a token: %v (timed out: %v)\n%s", wild, err, ctx.Err() != nil, out)
	}

	serveBridge := func(addr, token string, args ...string) *syncBuffer {
		t.Helper()
		cmd := exec.Command(binary, append([]string{"bridge", "--db", db, "--serve", addr, "--estimator", "none"}, args...)...)
		cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN="+token)
		logs := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitUntil(t, "the bridge to serve on "+addr, 20*time.Second, func() bool {
			return strings.Contains(logs.String(), "bridge: serving")
		})
		return logs
	}
	// --insecure-admin accepts the wild address.
	logs := serveBridge(wild, "", "--insecure-admin")
	if status, body := jsonPost(t, "http://127.0.0.1:"+port+"/lease", `{"n":1}`, ""); status != 200 {
		t.Fatalf("lease with --insecure-admin: %d %s\n%s", status, body, logs)
	}

	addr := freeAddr(t)
	const token = "adm-bridge-token-1"
	logs = serveBridge(addr, token)
	base := "http://" + addr
	for _, c := range []struct{ path, body, auth string }{
		{"/lease", `{"n":2}`, ""}, {"/lease", `{"n":2}`, "wrong"}, {"/ack", `{"lease_id":"lease-1"}`, ""},
	} {
		if status, body := jsonPost(t, base+c.path, c.body, c.auth); status != 401 || !strings.Contains(body, "ROLLGATE_ADMIN_TOKEN") {
			t.Errorf("POST %s with token %q: %d %s, want 401", c.path, c.auth, status, body)
		}
	}
	if r, err := http.Get(base + "/counts"); err != nil || r.StatusCode != 401 {
		t.Errorf("GET /counts without the token: %v %v, want 401", r, err)
	}
	status, body := jsonPost(t, base+"/lease", `{"n":2}`, token)
	var l struct {
		LeaseID string            `json:"lease_id"`
		Samples []json.RawMessage `json:"samples"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &l) != nil || len(l.Samples) != 2 || !leaseIDPattern.MatchString(l.LeaseID) {
		t.Fatalf("lease with the token: %d %s; want 2 samples under lease- and 32 hex digits\n%s", status, body, logs)
	}
	if _, err := hex.DecodeString(strings.TrimPrefix(l.LeaseID, "lease-")); err != nil {
		t.Fatal(err)
	}
	for _, guess := range []string{"lease-1", "lease-2"} {
		if status, body = jsonPost(t, base+"/ack", `{"lease_id":"`+guess+`"}`, token); status != 404 || strings.Contains(body, l.LeaseID) {
			t.Errorf("ack of the guessed %s: %d %s, want 404 naming no lease", guess, status, body)
		}
	}
	if status, body = jsonPost(t, base+"/ack", `{"lease_id":"`+l.LeaseID+`"}`, token); status != 200 {
		t.Errorf("ack of the real lease: %d %s", status, body)
	}
}
