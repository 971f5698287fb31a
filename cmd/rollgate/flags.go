package main

import (
	"flag"
	"io"

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
