package agl

import (
	"net/url"
	"strings"
	"testing"
)

// TestAllowList: agl.allowed_endpoints' entries and what each admits;
// credentials are refused and never quoted.
func TestAllowList(t *testing.T) {
	replicas := []string{"http://10.1.2.3:8000/v1", "http://vllm-0.svc:8000/v1", "http://[fd00::5]:8000/v1"}
	for _, tc := range []struct {
		entries []string
		allowed []string
		refused []string
	}{
		{nil, // default: loopback and the operator's replicas' hosts (any port)
			[]string{"http://127.0.0.1:8000/v1", "http://127.9.9.9/v1", "http://[::1]:9/v1", "http://localhost:1/v1", "http://LOCALHOST./v1",
				"http://[::ffff:127.0.0.1]:80/v1", "https://10.1.2.3:9999/v1", "http://VLLM-0.svc:1/v1", "http://[fd00::5]:1/v1"},
			[]string{"http://10.1.2.4:8000/v1", "http://192.0.2.1/v1", "http://vllm-1.svc:8000/v1", "http://2130706433/v1", "http://0x7f.1/v1",
				"http://metadata.google.internal/computeMetadata/v1", "http://169.254.169.254/latest"}},
		{[]string{"10.0.0.0/8", "gpu-node.internal", "192.0.2.7"},
			[]string{"http://10.200.0.1:8000/v1", "http://gpu-node.internal:8000/v1", "http://192.0.2.7:1/v1", "http://[::ffff:10.0.0.1]/v1"},
			[]string{"http://127.0.0.1:8000/v1", "http://192.0.2.8/v1", "http://node.internal/v1", "http://vllm-0.svc:8000/v1"}},
		{[]string{"*"}, []string{"http://anything.example/v1", "http://203.0.113.9:1/v1"}, nil},
	} {
		a, err := parseAllowList(tc.entries)
		if err != nil {
			t.Fatal(err)
		}
		a.operatorReplicas = func() []string { return replicas }
		for _, ep := range tc.allowed {
			if why := a.check(ep); why != "" {
				t.Errorf("%v: %s refused: %s", tc.entries, ep, why)
			}
		}
		for _, ep := range tc.refused {
			if why := a.check(ep); !strings.Contains(why, "agl.allowed_endpoints") || !strings.Contains(why, "--agl-allowed-endpoints") {
				t.Errorf("%v: %s: %q", tc.entries, ep, why)
			}
		}
		for _, ep := range []string{"http://u:pw-secret@127.0.0.1:8000/v1", "http://pw-secret@127.0.0.1/v1", "ftp://127.0.0.1/v1", "127.0.0.1:8000", "http:///v1",
			"http://127.0.0.1/v1?x=1", "http://u:pw-secret@[::1/v1"} {
			if why := a.check(ep); why == "" || strings.Contains(why, "pw-secret") {
				t.Errorf("%v: %s: %q", tc.entries, ep, why)
			}
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "a b", "http://x", "*.internal"} {
		if _, err := parseAllowList([]string{bad}); err == nil || !strings.Contains(err.Error(), "allowed_endpoints") {
			t.Errorf("entry %q: %v", bad, err)
		}
	}
}

// FuzzAllowCheck: any endpoint string is judged without a panic, and a
// refusal never quotes the password of its userinfo.
func FuzzAllowCheck(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:8000/v1", "http://u:p@127.0.0.1/v1", "http://u:p@ss@h/v1", "http://[::1", "%zz", "http://a:b@c:d@e/v1"} {
		f.Add(s)
	}
	a, err := parseAllowList(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ep string) {
		why := a.check(ep)
		u, err := url.Parse(ep)
		if err != nil || u.User == nil {
			return
		}
		if pw, ok := u.User.Password(); ok && len(pw) >= 4 && why != "" && strings.Contains(why, pw) && !strings.Contains(u.Host+u.Path, pw) {
			t.Fatalf("%q: the refusal quotes the password: %s", ep, why)
		}
		if why == "" {
			t.Fatalf("%q has credentials and was allowed", ep)
		}
	})
}
