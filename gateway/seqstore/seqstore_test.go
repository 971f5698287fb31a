package seqstore

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/testkit/testenv"
)

var postgresDSN string

func TestMain(m *testing.M) { testenv.PostgresMain(m, &postgresDSN) }

// each runs f with a DSN of a fresh SQLite file and of a fresh PostgreSQL
// database.
func each(t *testing.T, f func(t *testing.T, dsn string)) {
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			dsn := filepath.Join(t.TempDir(), "seq.db")
			if kind == "postgres" {
				var err error
				if dsn, err = testenv.FreshPostgresDatabase(postgresDSN, t.Name()); err != nil {
					t.Fatal(err)
				}
			}
			f(t, dsn)
		})
	}
}

func open(t *testing.T, dsn string, opt Options) Store {
	t.Helper()
	s, err := Open(context.Background(), dsn, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func reserve(t *testing.T, s Store, rollout, attempt string) Block {
	t.Helper()
	b, err := s.Reserve(context.Background(), rollout, attempt)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBlocksStartAtOneAndGrow(t *testing.T) {
	each(t, func(t *testing.T, dsn string) {
		s := open(t, dsn, Options{MinBlock: 4, MaxBlock: 16})
		f := func(rollout, attempt string, want Block) {
			t.Helper()
			if got := reserve(t, s, rollout, attempt); got != want {
				t.Fatalf("%s/%s: block %+v, want %+v", rollout, attempt, got, want)
			}
		}
		f("r", "a", Block{1, 4})
		f("r", "a", Block{5, 12})
		f("r", "a", Block{13, 28})
		f("r", "a", Block{29, 44}) // capped at MaxBlock
		f("r", "b", Block{1, 4})
		f("", "", Block{1, 16}) // unattributed: MaxBlock at once
	})
}

// TestRestartContinuesAbove: a store reopened on the same database (a
// restarted gateway) reserves above every block reserved before, starting
// small again.
func TestRestartContinuesAbove(t *testing.T) {
	each(t, func(t *testing.T, dsn string) {
		s, err := Open(context.Background(), dsn, Options{})
		if err != nil {
			t.Fatal(err)
		}
		reserve(t, s, "r", "a")
		last := reserve(t, s, "r", "a").Last
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s2 := open(t, dsn, Options{})
		if b := reserve(t, s2, "r", "a"); b.First != last+1 || b.Last-b.First+1 != 16 {
			t.Fatalf("after a restart: block %+v, want 16 ids from %d", b, last+1)
		}
	})
}

// TestTwoStoresConcurrentNoDuplicate: two stores on one database (two
// gateways), each with many goroutines reserving blocks of a few attempts:
// no id is reserved twice, and each goroutine's blocks increase.
func TestTwoStoresConcurrentNoDuplicate(t *testing.T) {
	each(t, func(t *testing.T, dsn string) {
		stores := []Store{open(t, dsn, Options{MinBlock: 2, MaxBlock: 8}), open(t, dsn, Options{MinBlock: 2, MaxBlock: 8})}
		for _, s := range stores {
			s.OnTakeover(func(string, string) {})
		}
		const goroutines, rounds = 16, 25
		var mu sync.Mutex
		got := map[string][]Block{}
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				s := stores[g%2]
				attempt := fmt.Sprint("a", g%3)
				var prev uint64
				for i := 0; i < rounds; i++ {
					b, err := s.Reserve(context.Background(), "r", attempt)
					if err != nil {
						t.Error(err)
						return
					}
					if b.First <= prev || b.Last < b.First {
						t.Errorf("goroutine %d: block %+v after id %d", g, b, prev)
						return
					}
					prev = b.Last
					mu.Lock()
					got[attempt] = append(got[attempt], b)
					mu.Unlock()
				}
			}(g)
		}
		if wg.Wait(); t.Failed() {
			return
		}
		for attempt, bs := range got {
			sort.Slice(bs, func(i, j int) bool { return bs[i].First < bs[j].First })
			if bs[0].First != 1 {
				t.Fatalf("%s: first block %+v", attempt, bs[0])
			}
			for i := 1; i < len(bs); i++ {
				if bs[i].First <= bs[i-1].Last {
					t.Fatalf("%s: blocks %+v and %+v overlap", attempt, bs[i-1], bs[i])
				}
			}
		}
	})
}

// TestTakeoverDropsBeforeReturning (PostgreSQL): when gateway B reserves an
// attempt gateway A holds, A has dropped it before B's Reserve returns; a
// takeover from a gateway that is gone does not wait.
func TestTakeoverDropsBeforeReturning(t *testing.T) {
	dsn, err := testenv.FreshPostgresDatabase(postgresDSN, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	a := open(t, dsn, Options{})
	b := open(t, dsn, Options{})
	var mu sync.Mutex
	var dropped []string
	a.OnTakeover(func(r, at string) { mu.Lock(); dropped = append(dropped, r+"/"+at); mu.Unlock() })
	b.OnTakeover(func(string, string) {})
	ma, mb := a.(*Postgres).m, b.(*Postgres).m

	ba := reserve(t, a, "r", "x")
	bb := reserve(t, b, "r", "x") // takes over from a
	mu.Lock()
	got := append([]string(nil), dropped...)
	mu.Unlock()
	if len(got) != 1 || got[0] != "r/x" {
		t.Fatalf("a dropped %v when b took r/x over, want [r/x]", got)
	}
	if bb.First <= ba.Last {
		t.Fatalf("b's block %+v not above a's %+v", bb, ba)
	}
	if n := testutil.ToFloat64(mb.takeovers.WithLabelValues("acked")); n != 1 {
		t.Fatalf("%v acknowledged takeovers, want 1", n)
	}
	reserve(t, b, "r", "x") // b holds it: no takeover
	if n := testutil.ToFloat64(mb.takeovers.WithLabelValues("acked")); n != 1 {
		t.Fatalf("%v acknowledged takeovers, want still 1", n)
	}
	// Unattributed calls notify nobody.
	reserve(t, a, "", "")
	reserve(t, b, "", "")
	mu.Lock()
	n := len(dropped)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("a dropped %d attempts, want 1 (unattributed calls are not taken over)", n)
	}

	// b is gone (a restart): a's takeover finds its lock free.
	b.Close()
	reserve(t, a, "r", "x")
	if n := testutil.ToFloat64(ma.takeovers.WithLabelValues("gone")); n != 1 {
		t.Fatalf("%v takeovers from a gone gateway, want 1", n)
	}
}

// TestListenerLossDropsEverything (PostgreSQL): when the listening session
// is killed, the store drops every attempt, refuses to reserve until it
// listens again, then reserves above.
func TestListenerLossDropsEverything(t *testing.T) {
	dsn, err := testenv.FreshPostgresDatabase(postgresDSN, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn, Options{}).(*Postgres)
	all := make(chan struct{}, 4)
	s.OnTakeover(func(r, a string) {
		if r == "" && a == "" {
			all <- struct{}{}
		}
	})
	first := reserve(t, s, "r", "a")
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var killed bool
	if err := db.QueryRow(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`,
		listenerApp(s.Instance())).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminating the listening session: %v %v", killed, err)
	}
	<-all // dropped everything
	// Reserve fails until the session is back, then succeeds above.
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := s.Reserve(context.Background(), "r", "a")
		if err == nil {
			if b.First <= first.Last {
				t.Fatalf("block %+v after %+v", b, first)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reservation after the session came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling for the reconnection
	}
}

// TestSlowDatabaseTimesOut (PostgreSQL): a reservation blocked by a lock
// on its row returns the context's error. The statement may still commit
// once the lock is released (the cancellation races it): its ids are a gap,
// never handed out.
func TestSlowDatabaseTimesOut(t *testing.T) {
	dsn, err := testenv.FreshPostgresDatabase(postgresDSN, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn, Options{})
	s.OnTakeover(func(string, string) {})
	first := reserve(t, s, "r", "a")
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`SELECT 1 FROM rg_sequences WHERE rollout_id = 'r' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = s.Reserve(ctx, "r", "a")
	cancel()
	if err == nil {
		t.Fatal("reserved while the row was locked")
	}
	tx.Rollback()
	if b := reserve(t, s, "r", "a"); b.First <= first.Last {
		t.Fatalf("block %+v after a timed-out reservation, want it above %d", b, first.Last)
	}
}

func TestPrune(t *testing.T) {
	each(t, func(t *testing.T, dsn string) {
		now := time.Unix(1_000_000, 0)
		var mu sync.Mutex
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		s := open(t, dsn, Options{Retention: time.Hour, Now: clock})
		s.OnTakeover(func(string, string) {})
		reserve(t, s, "old", "a")
		mu.Lock()
		now = now.Add(2 * time.Hour)
		mu.Unlock()
		reserve(t, s, "new", "a")
		n, err := s.(interface {
			Prune(context.Context) (int64, error)
		}).Prune(context.Background())
		if err != nil || n != 1 {
			t.Fatalf("pruned %d rows (%v), want 1", n, err)
		}
		if b := reserve(t, s, "new", "a"); b.First != 17 {
			t.Fatalf("a kept row restarted: %+v", b)
		}
	})
}
