package clickhouse

import (
	"context"
	"testing"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// serverDSN is the DSN of the ClickHouse server TestMain started.
var serverDSN string

func TestMain(m *testing.M) { testenv.Main(m, &serverDSN) }

// freshDSN returns a DSN for a database of its own for test t, dropped first
// in case a shared server still has it from an earlier run.
func freshDSN(t testing.TB) string {
	t.Helper()
	dsn := testenv.FreshDatabase(serverDSN, "t_"+t.Name())
	if err := testenv.DropDatabase(context.Background(), dsn); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// openStore opens a store on a fresh database and closes it when the test ends.
func openStore(t testing.TB, opt Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), freshDSN(t), opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
