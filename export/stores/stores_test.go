package stores

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rollgate/rollgate/testkit/testenv"
)

var serverDSN string

func TestMain(m *testing.M) { testenv.Main(m, &serverDSN) }

func TestOpenChoosesStore(t *testing.T) {
	ctx := context.Background()
	f := func(dsn, path, wantName string) {
		t.Helper()
		s, err := Open(ctx, dsn, path)
		if err != nil {
			t.Fatalf("Open(%q, %q): %v", dsn, path, err)
		}
		defer s.Close()
		if s.Name() != wantName {
			t.Fatalf("Open(%q, %q).Name() = %q, want %q", dsn, path, s.Name(), wantName)
		}
	}
	dir := t.TempDir()
	f("", filepath.Join(dir, "a.db"), "sqlite")
	dsn := testenv.FreshDatabase(serverDSN, "stores_test")
	if err := testenv.DropDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	f(dsn, filepath.Join(dir, "b.db"), "clickhouse")
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(context.Background(), "", ""); err == nil {
		t.Fatal("Open with neither DSN nor path: no error")
	}
	if _, err := Open(context.Background(), "clickhouse://127.0.0.1:1/x?dial_timeout=1s", ""); err == nil {
		t.Fatal("Open with an unreachable ClickHouse: no error")
	}
}
