package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
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

// envName is the environment variable that sets flag name.
func envName(name string) string {
	return "ROLLGATE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseWithEnv parses args; flags not given on the command line take their
// value from the environment when ROLLGATE_<NAME> is set. It returns the set
// of flags given either way.
func parseWithEnv(fs *flag.FlagSet, args []string) (map[string]bool, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
				return
			}
			set[f.Name] = true
		}
	})
	return set, err
}
