package testenv

import (
	"io"
	"os"
	"os/signal"
	"syscall"
)

// UntilStopped blocks until the process receives SIGINT or SIGTERM or its
// standard input closes: how the server commands scripts/test starts for a
// whole run (chserver, vllmserver) learn that the run is over.
func UntilStopped() {
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
}
