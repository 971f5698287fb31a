package clickhouse

import (
	"testing"

	"github.com/rollgate/rollgate/export/storetest"
)

// TestDeploySQL runs every saved query in deploy/sql against the real server.
func TestDeploySQL(t *testing.T) {
	storetest.RunQueryFiles(t, openStore(t, Options{}), "../../deploy/sql")
}
