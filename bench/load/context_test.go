package load

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
)

// TestRolloutContextIsTheRolloutsOwn: --context-bytes text is about the size
// asked, names its rollout (so no two rollouts share it) and is empty when off.
func TestRolloutContextIsTheRolloutsOwn(t *testing.T) {
	if got := rolloutContext("ro-1", 0); got != "" {
		t.Fatalf("context off: %q", got)
	}
	a, b := rolloutContext("ro-1", 2000), rolloutContext("ro-2", 2000)
	if len(a) < 2000 || len(a) > 2200 || !strings.Contains(a, "ro-1") {
		t.Fatalf("context of 2000 bytes: %d bytes, %.80q", len(a), a)
	}
	if a[:40] == b[:40] || strings.Contains(b, "ro-1") {
		t.Fatalf("two rollouts start their contexts alike: %.40q", a)
	}
}

// TestMultiTurnRolloutsHitTheirPrefix: with --context-bytes and --think-time
// each rollout's later turns resend its own context, which a mock engine
// with the prefix-cache model then serves from its cache.
func TestMultiTurnRolloutsHitTheirPrefix(t *testing.T) {
	ms, base, err := mock.Start(mock.Config{PrefixCacheBlocks: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	res, err := Run(context.Background(), Config{
		BaseURL: strings.TrimSuffix(base, "/v1"), PathStyle: PathPlain, Agents: 2, Turns: 4, Rollouts: 4,
		ContextBytes: 1000, ThinkTime: time.Millisecond, Stream: true, IncludeUsage: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Calls) != 16 {
		t.Fatalf("%d calls, want 4 rollouts x 4 turns", len(res.Calls))
	}
	for _, c := range res.Calls {
		if !c.OK() {
			t.Fatalf("call %+v failed", c)
		}
	}
	// Turns 2 to 4 of each rollout find at least its first turn's context
	// (about 1000 tokens: the mock's tokens are short) in the cache.
	if hits := ms.PrefixCacheHits(); hits < 4*3*500 {
		t.Fatalf("%d of %d prompt tokens served from the prefix cache, want each rollout's context from turn 2 on", hits, ms.PrefixCacheQueries())
	}
}
