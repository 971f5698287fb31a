package config

import (
	"flag"
	"sort"
	"strings"
)

// StringMap is a flag.Value of "key=value,key=value" bound to a
// map[string]string field: setting it replaces the map; parts without "="
// or with an empty key are skipped.
type StringMap map[string]string

// StringMapVar registers flag name on fs, bound to *p (its default is
// *p's value).
func StringMapVar(fs *flag.FlagSet, p *map[string]string, name, usage string) {
	fs.Var((*StringMap)(p), name, usage)
}

// String renders the map as key=value pairs sorted by key.
func (m *StringMap) String() string {
	if m == nil || len(*m) == 0 {
		return ""
	}
	parts := make([]string, 0, len(*m))
	for k, v := range *m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Set replaces the map with the pairs of s.
func (m *StringMap) Set(s string) error {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k != "" {
			out[k] = v
		}
	}
	*m = out
	return nil
}
