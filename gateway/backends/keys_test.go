package backends

import (
	"strings"
	"testing"
)

// TestUpstreamKeysPairing: a key is usable only for the origins it was
// configured with; the environment is read at construction only.
func TestUpstreamKeysPairing(t *testing.T) {
	env := map[string]string{"VLLM_KEY": "sk-v", "OTHER": "sk-o", "SPARE": "sk-s"}
	reads := map[string]int{}
	getenv := func(k string) string { reads[k]++; return env[k] }
	k, err := NewUpstreamKeys(
		[]Backend{{Model: "m", Replicas: []Replica{{URL: "https://GPU-1.internal/v1", APIKeyEnv: "VLLM_KEY"}, {URL: "http://10.0.0.2:8000/v1"}}}},
		map[string][]string{"SPARE": {"http://10.0.0.9:8000"}}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env, url, want, err string
	}{
		{"VLLM_KEY", "https://gpu-1.internal:443/v2", "Bearer sk-v", ""},
		{"VLLM_KEY", "https://gpu-1.internal:8443/v1", "", "not paired"},
		{"VLLM_KEY", "http://gpu-1.internal/v1", "", "not paired"},
		{"SPARE", "http://10.0.0.9:8000/v1", "Bearer sk-s", ""},
		{"SPARE", "http://10.0.0.2:8000/v1", "", "not paired"},
		{"OTHER", "https://gpu-1.internal/v1", "", "not configured at start"},
		{"HOME", "https://gpu-1.internal/v1", "", "not configured at start"},
	} {
		got, err := k.Bearer(tc.env, tc.url)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("bearer(%s, %s) = %q, %v; want %q, %q", tc.env, tc.url, got, err, tc.want, tc.err)
		}
	}
	if reads["OTHER"] != 0 || reads["HOME"] != 0 {
		t.Fatalf("variables read beyond the configured ones: %v", reads)
	}
	if _, err := NewUpstreamKeys([]Backend{{Model: "m", Replicas: []Replica{{URL: "http://h/v1", APIKeyEnv: "UNSET"}}}}, nil, getenv); err == nil {
		t.Fatal("an unset variable must stop the start")
	}
	if _, err := NewUpstreamKeys(nil, map[string][]string{"SPARE": nil}, getenv); err == nil {
		t.Fatal("an allow-list entry without origins must be refused")
	}
	if _, err := NewUpstreamKeys(nil, map[string][]string{"SPARE": {"ftp://h"}}, getenv); err == nil {
		t.Fatal("a non-http origin must be refused")
	}
}
