package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rollgate/rollgate/capture"
)

// TestRedactionRules: rules in the config file rewrite what is stored, not
// what the client gets; a bad rule stops the gateway at start with its name.
func TestRedactionRules(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cfg := map[string]any{
		"listen": addr,
		"db":     db,
		"redact": []map[string]any{
			{"name": "api-keys", "pattern": `sk-[A-Za-z0-9]{20,}`, "replacement": "[REDACTED_KEY]"},
			{"name": "emails", "pattern": `[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`, "replacement": "[EMAIL]", "fields": []string{"request_body"}},
		},
	}
	b, _ := yaml.Marshal(cfg)
	path := filepath.Join(t.TempDir(), "rollgate.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, addr, "/readyz", "serve", "--config", path)
	secret := "sk-abcdefghijklmnopqrstuvwxyz0123"
	status, body, h := post(t, "http://"+addr+"/v1/chat/completions",
		`{"model":"mock-model","messages":[{"role":"user","content":"my key is `+secret+` and I am ann@example.org"}]}`)
	if status != 200 || !strings.Contains(body, `"choices"`) {
		t.Fatalf("call: %d %s", status, body)
	}
	span := h.Get("x-request-id")
	var out string
	waitUntil(t, "the call's row", 15*time.Second, func() bool {
		out = runCmd(t, "sql", "--db", db, "SELECT request_body FROM llm_calls WHERE span_id = '"+span+"'")
		return strings.Contains(out, "(1 row)")
	})
	if !strings.Contains(out, "[REDACTED_KEY]") || !strings.Contains(out, "[EMAIL]") || strings.Contains(out, secret) || strings.Contains(out, "ann@example.org") {
		t.Fatalf("stored request body not redacted:\n%s", out)
	}
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(m), `rollgate_redactions_total{rule="api-keys"} 1`) {
		t.Fatalf("redaction metric missing")
	}

	// A rule that does not compile stops the start, naming the rule.
	bad, _ := yaml.Marshal(map[string]any{"listen": freeAddr(t), "db": db + "2",
		"redact": []map[string]any{{"name": "broken", "pattern": "(unclosed"}}})
	badPath := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(badPath, bad, 0o600)
	cmd := exec.Command(binary, "serve", "--config", badPath)
	outb, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(outb), "redact broken") {
		t.Fatalf("bad rule: %v\n%s", err, outb)
	}
}

// TestExampleConfigParses: deploy/rollgate.example.yaml decodes into the
// serve config with no unknown keys, and its redaction rules compile.
func TestExampleConfigParses(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "deploy", "rollgate.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var fc fileConfig
	if err := dec.Decode(&fc); err != nil {
		t.Fatalf("example config: %v", err)
	}
	if len(fc.Redact) == 0 || len(fc.Gateway.Backends) == 0 || fc.Gateway.ClientWriteTimeout == 0 {
		t.Fatalf("example config lost sections: %+v", fc)
	}
	if _, err := capture.NewRedactor(fc.Redact); err != nil {
		t.Fatal(err)
	}
}
