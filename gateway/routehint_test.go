package gateway

import (
	"strings"
	"testing"
)

// TestUnknownRouteMessage: a path under /rollout/ that is not a
// per-rollout call gets the expected form, with an example built from the
// caller's ids and endpoint when they are usable; other paths do not.
func TestUnknownRouteMessage(t *testing.T) {
	for _, tc := range []struct {
		path    string
		want    []string
		notWant string
	}{
		{"/rollout/x/v1/chat/completions", []string{rolloutBaseURL, "e.g. /rollout/x/attempt/1/v1/chat/completions"}, ""},
		{"/rollout/r-1/attempt/a-2/chat/completions", []string{rolloutBaseURL, "e.g. /rollout/r-1/attempt/a-2/v1/chat/completions"}, ""},
		{"/rollout/x/attempt/1/v1/nothing", []string{rolloutBaseURL}, "e.g."},
		{"/rollout/bad%20id/v1/models", []string{rolloutBaseURL}, "e.g."},
		{"/rollout/", []string{rolloutBaseURL}, "e.g."},
		{"/v1/nothing-here", []string{"unknown route POST /v1/nothing-here"}, "rollout"},
	} {
		got := unknownRouteMessage([]byte("POST"), []byte(tc.path))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.path, got, w)
			}
		}
		if tc.notWant != "" && strings.Contains(got, tc.notWant) {
			t.Errorf("%s: %q has %q", tc.path, got, tc.notWant)
		}
	}
}

// FuzzUnknownRouteMessage: any path gets a bounded message, never a panic.
func FuzzUnknownRouteMessage(f *testing.F) {
	for _, s := range []string{"/rollout/", "/rollout/x", "/rollout/x/attempt/", "/rollout/x/v1/chat/completions", "/rollout//attempt//v1/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		if got := unknownRouteMessage([]byte("GET"), []byte(path)); len(got) > 2048 {
			t.Fatalf("message of %d bytes", len(got))
		}
	})
}
