package testenv

import (
	"context"
	"strings"
	"testing"
)

func TestStartClickHouse(t *testing.T) {
	t.Setenv(EnvClickHouseDSN, "")
	dsn, stop, err := StartClickHouse()
	if err != nil {
		t.Fatalf("StartClickHouse: %v", err)
	}
	if !strings.HasPrefix(dsn, "clickhouse://127.0.0.1:") || !strings.HasSuffix(dsn, "/default") {
		stop()
		t.Fatalf("dsn = %q", dsn)
	}
	fresh := FreshDatabase(dsn, "TestX/sub-case 1")
	if !strings.HasSuffix(fresh, "/TestX_sub_case_1") {
		stop()
		t.Fatalf("FreshDatabase = %q", fresh)
	}
	if err := DropDatabase(context.Background(), fresh); err != nil {
		stop()
		t.Fatalf("DropDatabase on a live server: %v", err)
	}
	if err := PingClickHouse(strings.TrimSuffix(strings.TrimPrefix(dsn, "clickhouse://"), "/default")); err != nil {
		stop()
		t.Fatalf("ping: %v", err)
	}
	stop()
	if err := DropDatabase(context.Background(), fresh); err == nil {
		t.Fatal("DropDatabase after stop: no error, server still up")
	}
}

func TestStartClickHouseUsesEnv(t *testing.T) {
	t.Setenv(EnvClickHouseDSN, "clickhouse://127.0.0.1:1/x")
	dsn, stop, err := StartClickHouse()
	if err != nil || dsn != "clickhouse://127.0.0.1:1/x" {
		t.Fatalf("StartClickHouse = %q, %v", dsn, err)
	}
	stop()
}

func TestStartClickHouseMissingBinary(t *testing.T) {
	t.Setenv(EnvClickHouseDSN, "")
	t.Setenv("PATH", t.TempDir())
	old := ServerBinary
	ServerBinary = "/nonexistent/clickhouse-server"
	defer func() { ServerBinary = old }()
	_, _, err := StartClickHouse()
	if err == nil || !strings.Contains(err.Error(), "install it: apt-get install clickhouse-server (or run ./scripts/test)") {
		t.Fatalf("err = %v", err)
	}
}

func TestIdentifier(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := Identifier(in); got != want {
			t.Fatalf("Identifier(%q) = %q, want %q", in, got, want)
		}
	}
	f("abc_1", "abc_1")
	f("Test/a-b c", "Test_a_b_c")
	f("1x", "_1x")
	f("", "_")
	f("日本", "______")
}

func TestDropDatabaseRefusesDefault(t *testing.T) {
	for _, dsn := range []string{"clickhouse://127.0.0.1:1/default", "clickhouse://127.0.0.1:1/system", "clickhouse://127.0.0.1:1"} {
		if err := DropDatabase(context.Background(), dsn); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("DropDatabase(%s) = %v", dsn, err)
		}
	}
}
