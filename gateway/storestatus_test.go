package gateway

import (
	"encoding/json"
	"testing"
)

func TestAppendStoreStatus(t *testing.T) {
	f := func(st *StoreStatus, want string) {
		t.Helper()
		s := &Server{}
		if st != nil {
			s.SetStoreStatus(func() StoreStatus { return *st })
		}
		got := string(append(s.appendStoreStatus([]byte(`{"status":"ready"`)), '}'))
		if got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Fatalf("not JSON: %s", got)
		}
	}
	f(nil, `{"status":"ready"}`)
	f(&StoreStatus{State: "up"}, `{"status":"ready","store":"up"}`)
	f(&StoreStatus{State: "down", Spool: true, SpoolBytes: 1234, SpoolRecords: 5},
		`{"status":"ready","store":"down","spool_bytes":1234,"spool_records":5}`)
	f(&StoreStatus{State: "up", Spool: true, WAL: true, WALBytes: 99, WALPending: 2},
		`{"status":"ready","store":"up","spool_bytes":0,"spool_records":0,"wal_bytes":99,"wal_pending":2}`)
}
