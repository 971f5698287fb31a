// Command chserver starts one real ClickHouse server for a whole test run
// (scripts/test): it runs /usr/sbin/clickhouse-server on free loopback ports
// with its own temporary data folder, prints the DSN on stdout, and stops the
// server when it receives SIGINT/SIGTERM or its stdin closes.
package main

import (
	"fmt"
	"os"

	"github.com/rollgate/rollgate/testkit/testenv"
)

func main() {
	os.Unsetenv(testenv.EnvClickHouseDSN) // always start a server of our own
	dsn, stop, err := testenv.StartClickHouse()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chserver:", err)
		os.Exit(1)
	}
	fmt.Println(dsn)
	testenv.UntilStopped()
	stop()
}
