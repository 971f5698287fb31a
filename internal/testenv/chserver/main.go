// Command chserver starts one real ClickHouse server for a whole test run
// (scripts/test): it runs /usr/sbin/clickhouse-server on free loopback ports
// with its own temporary data folder, prints the DSN on stdout, and stops the
// server when it receives SIGINT/SIGTERM or its stdin closes.
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rollgate/rollgate/internal/testenv"
)

func main() {
	os.Unsetenv(testenv.EnvClickHouseDSN) // always start a server of our own
	dsn, stop, err := testenv.StartClickHouse()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chserver:", err)
		os.Exit(1)
	}
	fmt.Println(dsn)
	done := make(chan struct{}, 2)
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		done <- struct{}{}
	}()
	<-done
	stop()
}
