package config

import (
	"flag"
	"fmt"
	"sort"
	"strconv"
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

// StringList is a flag.Value of "a,b,c" bound to a []string field:
// setting it replaces the list with its non-empty, trimmed parts.
type StringList []string

// StringListVar registers flag name on fs, bound to *p.
func StringListVar(fs *flag.FlagSet, p *[]string, name, usage string) {
	fs.Var((*StringList)(p), name, usage)
}

// String joins the list with commas.
func (l *StringList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

// Set replaces the list with the parts of s.
func (l *StringList) Set(s string) error {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	*l = out
	return nil
}

// Float64Ptr is a flag.Value bound to a *float64 field, for settings
// whose absence (nil) differs from every value.
type Float64Ptr struct{ p **float64 }

// Float64PtrVar registers flag name on fs, bound to *p; unset leaves *p as it is.
func Float64PtrVar(fs *flag.FlagSet, p **float64, name, usage string) {
	fs.Var(&Float64Ptr{p}, name, usage)
}

// Field returns the address of the field the flag is bound to (FlagsOf).
func (v *Float64Ptr) Field() any { return v.p }

// String renders the value, or "" when nil.
func (v *Float64Ptr) String() string {
	if v == nil || v.p == nil || *v.p == nil {
		return ""
	}
	return strconv.FormatFloat(**v.p, 'g', -1, 64)
}

// Set parses a number.
func (v *Float64Ptr) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return fmt.Errorf("want a number: %w", err)
	}
	*v.p = &f
	return nil
}

// BoolPtr is a flag.Value bound to a *bool field, for settings whose
// absence (nil) differs from false and true.
type BoolPtr struct{ p **bool }

// BoolPtrVar registers flag name on fs, bound to *p; unset leaves *p as it is.
func BoolPtrVar(fs *flag.FlagSet, p **bool, name, usage string) {
	fs.Var(&BoolPtr{p}, name, usage)
}

// Field returns the address of the field the flag is bound to (FlagsOf).
func (v *BoolPtr) Field() any { return v.p }

// IsBoolFlag lets the flag stand alone (--name means --name=true).
func (v *BoolPtr) IsBoolFlag() bool { return true }

// String renders the value, or "" when nil.
func (v *BoolPtr) String() string {
	if v == nil || v.p == nil || *v.p == nil {
		return ""
	}
	return strconv.FormatBool(**v.p)
}

// Set parses a bool as flag.Bool does.
func (v *BoolPtr) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("want true or false: %w", err)
	}
	*v.p = &b
	return nil
}
