package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/stores"
	"github.com/rollgate/rollgate/gateway"
)

// storeConn is the capture store serve opened, and what /readyz says of it.
type storeConn struct {
	export.Store
	bg    *stores.Background          // ClickHouse connecting in the background; nil otherwise
	spool atomic.Pointer[spool.Spool] // told to replay at once when bg connects
	wal   atomic.Pointer[capture.WAL] // capture's write-ahead log, if on
}

// openStore opens the capture store. With a ClickHouse DSN and a spool
// (--spool-dir), serve does not wait for ClickHouse: it connects in the
// background while captured rows wait in the spool. Without a spool it
// connects now and fails fast, saying how to start without the store.
func openStore(ctx context.Context, dsn, dbPath string, spooled bool, opt clickhouse.Options, log *slog.Logger) (*storeConn, error) {
	sc := &storeConn{}
	if dsn == "" || !spooled {
		s, err := stores.OpenWith(ctx, dsn, dbPath, opt)
		if err != nil {
			if dsn != "" {
				return nil, fmt.Errorf("%w (start ClickHouse, or add --spool-dir DIR to start without it: captured calls then wait on disk and are stored once it connects)", err)
			}
			return nil, err
		}
		sc.Store = s
		return sc, nil
	}
	bg, err := stores.OpenBackground(dsn, stores.BackgroundOptions{ClickHouse: opt, OnUp: func() {
		if sp := sc.spool.Load(); sp != nil {
			sp.RetryNow()
		}
	}}, log)
	if err != nil {
		return nil, err
	}
	sc.Store, sc.bg = bg, bg
	return sc, nil
}

// status is what /readyz reports of the store and its spool.
func (sc *storeConn) status() gateway.StoreStatus {
	st := gateway.StoreStatus{State: stores.StateUp}
	if sc.bg != nil {
		st.State = sc.bg.State()
	}
	if sp := sc.spool.Load(); sp != nil {
		s := sp.Stats()
		st.Spool, st.SpoolBytes, st.SpoolRecords = true, s.Bytes, s.Records
	}
	if w := sc.wal.Load(); w != nil {
		s := w.Stats()
		st.WAL, st.WALBytes, st.WALPending = true, s.Bytes, s.Pending
	}
	return st
}
