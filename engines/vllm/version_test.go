package vllm

import "testing"

func TestVersionBefore(t *testing.T) {
	for v, old := range map[string]bool{
		"0.9.2": true, "0.10.1.1": true, "0.10.1": true, "0.8.5.post1": true, "0.10.2": false, "0.10.2rc1": false,
		"0.11.0.dev12+gabc": false, "1.0": false, "0.10": true, "": false, "dev": false, "v0.9.0": false,
	} {
		if got := versionBefore(v, 0, 10, 2); got != old {
			t.Errorf("versionBefore(%q, 0.10.2) = %v, want %v", v, got, old)
		}
	}
}
