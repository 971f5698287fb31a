package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"

	"github.com/rollgate/rollgate/internal/config"
)

// newFlagSet returns a FlagSet whose -h prints the command's summary and
// flags to out, grouped by sections when given (printHelp). A parse error
// prints nothing: the command reports it in one line (flagError).
func newFlagSet(name, summary string, out io.Writer, sections ...flagSection) *flag.FlagSet {
	fs := flag.NewFlagSet("rollgate "+name, flag.ContinueOnError)
	failure := &parseFailure{}
	fs.SetOutput(failure)
	fs.Usage = func() {
		if failure.failed {
			failure.failed = false
			return
		}
		printHelp(out, fs, summary, sections)
	}
	return fs
}

// parseWithEnv parses args; flags not given on the command line take their
// value from the environment when ROLLGATE_<NAME> is set (config.EnvName).
// It returns the set of flags given either way. Commands without a config
// file use it; serve loads its file too (config.Load).
func parseWithEnv(fs *flag.FlagSet, args []string) (map[string]bool, error) {
	if err := fs.Parse(args); err != nil {
		return nil, flagError(fs, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fromEnv, err := config.ApplyEnv(fs, set)
	for _, name := range fromEnv {
		set[name] = true
	}
	return set, err
}

// listen binds a TCP listener on addr, the value of flagName ("--listen"),
// and says what went wrong and how to fix it when it cannot: a port in use
// or one that needs privileges names the flag and another address to try.
func listen(flagName, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	other := "another port"
	if host, port, serr := net.SplitHostPort(addr); serr == nil {
		if n, perr := strconv.Atoi(port); perr == nil && n > 0 && n < 65535 {
			other = "another port, e.g. " + flagName + " " + net.JoinHostPort(host, strconv.Itoa(max(n+1, 1024)))
		}
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("%s %s: the port is in use by another process (another rollgate?); stop it or pick %s: %w", flagName, addr, other, err)
	case errors.Is(err, syscall.EACCES):
		return nil, fmt.Errorf("%s %s: not allowed to listen there (ports below 1024 need privileges); pick %s: %w", flagName, addr, other, err)
	}
	return nil, fmt.Errorf("%s %s: %w", flagName, addr, err)
}
