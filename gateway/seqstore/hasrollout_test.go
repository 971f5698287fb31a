package seqstore

import (
	"context"
	"testing"
)

// TestHasRollout: a rollout is found once ids of any of its attempts are
// reserved, by this store or another on the same database, and not before.
func TestHasRollout(t *testing.T) {
	each(t, func(t *testing.T, dsn string) {
		a, b := open(t, dsn, Options{}), open(t, dsn, Options{})
		ctx := context.Background()
		if ok, err := a.(RolloutFinder).HasRollout(ctx, "r1"); ok || err != nil {
			t.Fatalf("before any reservation: %v %v", ok, err)
		}
		reserve(t, b, "r1", "a2")
		if ok, err := a.(RolloutFinder).HasRollout(ctx, "r1"); !ok || err != nil {
			t.Fatalf("after another store reserved r1/a2: %v %v", ok, err)
		}
		if ok, _ := a.(RolloutFinder).HasRollout(ctx, "r"); ok {
			t.Fatal("a prefix of a reserved rollout id is found")
		}
	})
}
