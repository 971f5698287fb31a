// Package stores opens the configured export.Store: ClickHouse when a DSN is
// given, otherwise the embedded SQLite file. It lives apart from package
// export so that export does not import its own sub-packages.
package stores

import (
	"context"
	"fmt"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
)

// Open returns a ClickHouse store when clickhouseDSN is non-empty (default
// Options), else a SQLite store at sqlitePath.
func Open(ctx context.Context, clickhouseDSN, sqlitePath string) (export.Store, error) {
	return OpenWith(ctx, clickhouseDSN, sqlitePath, clickhouse.Options{})
}

// OpenWith is Open with ClickHouse options (TTL and the like).
func OpenWith(ctx context.Context, clickhouseDSN, sqlitePath string, opt clickhouse.Options) (export.Store, error) {
	if clickhouseDSN != "" {
		s, err := clickhouse.Open(ctx, clickhouseDSN, opt)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	if sqlitePath == "" {
		return nil, fmt.Errorf("stores: no ClickHouse DSN and no SQLite path: set one of them")
	}
	s, err := sqlite.Open(sqlitePath)
	if err != nil {
		return nil, err
	}
	return s, nil
}
