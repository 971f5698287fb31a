package clickhouse

import (
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// parseDSN reads dsn and checks what can be checked without a server: the
// syntax, the native protocol and the database name ("default" when the DSN
// names none).
func parseDSN(dsn string) (*clickhouse.Options, string, error) {
	chOpts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("clickhouse: parse DSN: %w", err)
	}
	if chOpts.Protocol == clickhouse.HTTP {
		return nil, "", fmt.Errorf("clickhouse: DSN %q uses HTTP; use the native protocol (clickhouse://host:9000/db)", redact(dsn))
	}
	db := chOpts.Auth.Database
	if db == "" {
		db = "default"
	}
	if err := checkIdent(db); err != nil {
		return nil, "", err
	}
	return chOpts, db, nil
}

// CheckDSN reports whether dsn is a DSN Open can use, without connecting: a
// mistake in it is found at once, not after retries against a server.
func CheckDSN(dsn string) error {
	_, _, err := parseDSN(dsn)
	return err
}

// RedactDSN hides the password of dsn, for logs and error messages.
func RedactDSN(dsn string) string { return redact(dsn) }
