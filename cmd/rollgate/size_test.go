package main

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"192MiB": 192 << 20, "1GiB": 1 << 30, "512KiB": 512 << 10, "2MB": 2e6, "100B": 100, "4096": 4096, "1.5 GiB": 3 << 29} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1MiB", "0", "lots", "1e30GiB"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q): no error", bad)
		}
	}
}
