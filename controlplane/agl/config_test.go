package agl

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/internal/config"
	"github.com/rollgate/rollgate/internal/openai"
)

// TestConfig: the agl: block, flags winning over it, and the forced fields
// each mode and endpoint gets (AGL's default_proxy semantics).
func TestConfig(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	fs.String("config", "", "the agl: block")
	path := filepath.Join(t.TempDir(), "agl.yaml")
	if err := os.WriteFile(path, []byte("enabled: true\nkey: k\nmodel_name: m\nval_temperature: 0.6\nretry_backoff: 20ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(fs, []string{"--config", path, "--agl-val-temperature", "0.5"}, "config", &c); err != nil {
		t.Fatal(err)
	}
	if c.Retries != DefaultRetries {
		t.Fatalf("retries %d, want the default %d", c.Retries, DefaultRetries)
	}
	if !c.Enabled || c.Key != "k" || *c.ValTemperature != 0.5 || c.IncludeLogProbs != nil || c.RetryBackoff.Milliseconds() != 20 {
		t.Fatalf("merged config: %+v", c)
	}
	sets, err := c.check()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		train bool
		ep    openai.Endpoint
		want  string
	}{
		{true, openai.ChatCompletions, `{"model":"m","temperature":1,"return_token_ids":true,"logprobs":true}`},
		{true, openai.Completions, `{"model":"m","temperature":1,"return_token_ids":true,"logprobs":1}`},
		{false, openai.ChatCompletions, `{"model":"m","temperature":0.5,"return_token_ids":true}`},
		{false, openai.Completions, `{"model":"m","temperature":0.5,"return_token_ids":true}`},
	} {
		if got := sets.get(tc.train, tc.ep).Record(); got != tc.want {
			t.Errorf("train=%v %v: %s, want %s", tc.train, tc.ep, got, tc.want)
		}
	}
	c.Force = []string{"temperature"}
	if sets, err = c.check(); err != nil || sets.get(true, openai.ChatCompletions).Record() != `{"temperature":1}` {
		t.Fatalf("force [temperature]: %v %v", sets, err)
	}
	c.Force = []string{"seed"}
	if _, err := c.check(); err == nil || !strings.Contains(err.Error(), "seed") {
		t.Fatalf("unknown forced field: %v", err)
	}
	if _, err := (&Config{}).check(); err == nil || !strings.Contains(err.Error(), "model_name") {
		t.Fatalf("no model name: %v", err)
	}
}
