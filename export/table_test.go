package export

import (
	"errors"
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	f := func(r *Result, want string) {
		t.Helper()
		var b strings.Builder
		if err := WriteTable(&b, r); err != nil {
			t.Fatalf("WriteTable: %v", err)
		}
		if b.String() != want {
			t.Fatalf("WriteTable:\n%s\nwant:\n%s", b.String(), want)
		}
	}
	f(&Result{Columns: []string{"rollout_id", "n"}, Rows: [][]string{{"r1", "3"}, {"rollout-22", "10"}}},
		" rollout_id | n\n"+
			"------------+----\n"+
			" r1         | 3\n"+
			" rollout-22 | 10\n"+
			"(2 rows)\n")
	f(&Result{Columns: []string{"x"}, Rows: [][]string{{"日本語"}}},
		" x\n"+
			"--------\n"+
			" 日本語\n"+
			"(1 row)\n")
	f(&Result{Columns: []string{"a", "b"}},
		" a | b\n"+
			"---+---\n"+
			"(0 rows)\n")
	f(&Result{Columns: []string{"body", "k"}, Rows: [][]string{{"line1\nline2\t\x01\xff", "v"}, {"short"}}},
		" body                   | k\n"+
			"------------------------+---\n"+
			` line1\nline2\t\x01\xff | v`+"\n"+
			" short                  | \n"+
			"(2 rows)\n")
	f(&Result{}, "(0 rows)\n")
	f(nil, "(0 rows)\n")
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteTableError(t *testing.T) {
	err := WriteTable(failWriter{}, &Result{Columns: []string{"a"}, Rows: [][]string{{"1"}}})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("WriteTable to a failing writer = %v, want the write error", err)
	}
}

func BenchmarkWriteTable(b *testing.B) {
	r := &Result{Columns: []string{"rollout_id", "attempt_id", "calls", "tokens"}}
	for i := 0; i < 1000; i++ {
		r.Rows = append(r.Rows, []string{"rollout-12345", "attempt-1", "42", "123456"})
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteTable(discard{}, r); err != nil {
			b.Fatal(err)
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
