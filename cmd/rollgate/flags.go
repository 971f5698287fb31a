package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/rollgate/rollgate/internal/config"
)

// newFlagSet returns a FlagSet whose usage prints the command's summary and flags.
func newFlagSet(name, summary string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rollgate "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "%s\n\nFlags (each also read from ROLLGATE_<FLAG_NAME_IN_UPPER_SNAKE_CASE>):\n", summary)
		fs.PrintDefaults()
	}
	return fs
}

// parseWithEnv parses args; flags not given on the command line take their
// value from the environment when ROLLGATE_<NAME> is set (config.EnvName).
// It returns the set of flags given either way. Commands without a config
// file use it; serve loads its file too (config.Load).
func parseWithEnv(fs *flag.FlagSet, args []string) (map[string]bool, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fromEnv, err := config.ApplyEnv(fs, set)
	for _, name := range fromEnv {
		set[name] = true
	}
	return set, err
}
