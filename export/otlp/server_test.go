package otlp

import "testing"

func TestParseServer(t *testing.T) {
	cases := []struct {
		in   string
		addr string
		port int
	}{
		{"http://10.0.0.11:8000/v1", "10.0.0.11", 8000},
		{"https://api.openai.com/v1", "api.openai.com", 443},
		{"http://engine/v1", "engine", 80},
		{"127.0.0.1:9999/v1", "127.0.0.1", 9999},
		{"[::1]:8000/v1", "::1", 8000},
		{"vllm-a", "vllm-a", 0},
		{"bad name%zz", "bad name%zz", 0},
	}
	for _, tc := range cases {
		got := parseServer(tc.in)
		if got.addr != tc.addr || got.port != tc.port {
			t.Errorf("parseServer(%q) = %q:%d, want %q:%d", tc.in, got.addr, got.port, tc.addr, tc.port)
		}
	}
}

func FuzzParseServer(f *testing.F) {
	for _, s := range []string{"http://10.0.0.11:8000/v1", "vllm-a", "[::1]:80", "a:99999999999", "https://", "%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := parseServer(s)
		if got.port < 0 {
			t.Fatalf("parseServer(%q): negative port %d", s, got.port)
		}
		if got.addr == "" && s != "" && got.port == 0 && !hasHostPrefix(s) {
			t.Fatalf("parseServer(%q): empty address", s)
		}
	})
}

// hasHostPrefix reports inputs whose host part may legitimately be empty.
func hasHostPrefix(s string) bool {
	for _, c := range s {
		if c == ':' || c == '/' || c == '?' || c == '#' || c == '@' || c == '[' {
			return true
		}
	}
	return false
}
