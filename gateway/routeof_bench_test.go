package gateway

import "testing"

// BenchmarkRouteOf measures finding a path's model endpoint (every call's
// first step; routeOf): a model route, the route list's last fixed path,
// a subtree (/api/v1/...) and a path no route serves.
//
//	go test -run '^$' -bench BenchmarkRouteOf -benchmem ./gateway/
func BenchmarkRouteOf(b *testing.B) {
	for _, p := range []string{"/v1/chat/completions", "/readyz", "/api/v1/rollouts/ro-1", "/v2/nothing/at/all"} {
		b.Run(p, func(b *testing.B) {
			path := []byte(p)
			b.ReportAllocs()
			for b.Loop() {
				routeOf(path)
			}
		})
	}
}
