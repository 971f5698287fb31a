// Package config fills a command's configuration from its one source of
// truth: the component Config structs. Each component registers its own
// flags on a flag.FlagSet, bound to its struct's fields, with its defaults
// written once (see gateway.Config.RegisterFlags); the same structs carry
// yaml tags, so a YAML file, the environment and the command line all fill
// the same fields. Load applies them in one documented precedence:
//
//	a flag on the command line > its environment variable > the YAML file > the default
//
// The environment variable of flag --some-flag is ROLLGATE_SOME_FLAG
// (EnvName). A setting that is a list or map of structures (a routing
// table, redaction rules) exists in the file only; every scalar setting in
// the file has a flag, and so an environment variable (FlagsOf lets a test
// assert that for a whole configuration).
//
// A component plugs in with one line: a field (usually inlined or a named
// section) in the command's root struct, and a call of its RegisterFlags.
package config

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// EnvPrefix starts the name of every flag's environment variable.
const EnvPrefix = "ROLLGATE_"

// EnvName is the environment variable that sets the flag called name:
// "upstream-kind" is ROLLGATE_UPSTREAM_KIND.
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Source says where a setting's value came from.
type Source int

// The sources of a value, lowest precedence first.
const (
	Default Source = iota // the flag's default (the component's)
	File                  // the YAML file
	Env                   // the flag's environment variable
	Flag                  // the command line
)

// String names the source for logs and errors.
func (s Source) String() string {
	switch s {
	case File:
		return "file"
	case Env:
		return "environment"
	case Flag:
		return "flag"
	}
	return "default"
}

// Result is what Load found: the source of every flag, and the keys of the
// file that are no setting (ignored, as a typo would be).
type Result struct {
	// Sources maps a flag name to where its value came from; flags not
	// listed have their default.
	Sources map[string]Source
	// Unknown lists the file's keys that name no setting ("capture.qeue_size").
	Unknown []string
}

// Explicit reports whether the flag's value was given by the file, the
// environment or the command line rather than being its default.
func (r Result) Explicit(name string) bool { return r.Sources[name] != Default }

// Load fills root (a pointer to the struct the YAML file decodes into,
// whose fields the flags of fs are bound to) in the order default < file <
// environment < command line. configFlag names the flag holding the file's
// path (itself settable from the environment); an empty path loads no file.
// Errors from the command line are returned as fs.Parse returns them
// (flag.ErrHelp after -h).
//
// The flags' defaults must already be in root: registering a flag with
// fs.IntVar(&c.X, ...) writes its default there. Flag values must be safe
// to set twice (the command line is parsed before and after the file, so
// that the file's path can come from it and its values still win).
func Load(fs *flag.FlagSet, args []string, configFlag string, root any) (Result, error) {
	res := Result{Sources: map[string]Source{}}
	if err := fs.Parse(args); err != nil {
		return res, err
	}
	fs.Visit(func(f *flag.Flag) { res.Sources[f.Name] = Flag })
	path := ""
	if f := fs.Lookup(configFlag); f != nil {
		path = f.Value.String()
		if v, ok := os.LookupEnv(EnvName(configFlag)); ok && res.Sources[configFlag] != Flag {
			path = v
		}
	}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return res, fmt.Errorf("reading config: %w", err)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(b, &doc); err != nil {
			return res, fmt.Errorf("parsing %s: %w", path, err)
		}
		if doc.Kind != 0 { // an empty file sets nothing
			if err := doc.Decode(root); err != nil {
				return res, fmt.Errorf("parsing %s: %w", path, err)
			}
		}
		flags := FlagsOf(fs)
		res.Unknown = walkNode(&doc, reflect.ValueOf(root).Elem(), "", func(_ string, v reflect.Value) {
			if f := flags[v.Addr().Pointer()]; f != nil && res.Sources[f.Name] != Flag {
				res.Sources[f.Name] = File
			}
		})
	}
	set := map[string]bool{}
	for name, s := range res.Sources {
		set[name] = s == Flag
	}
	envSet, err := ApplyEnv(fs, set)
	for _, name := range envSet {
		res.Sources[name] = Env
	}
	if err != nil {
		return res, err
	}
	// The command line again, over the file and the environment.
	return res, fs.Parse(args)
}

// ApplyEnv sets every flag of fs not in skip from its environment variable
// (EnvName), when that is set, and returns the names of the flags it set.
func ApplyEnv(fs *flag.FlagSet, skip map[string]bool) ([]string, error) {
	var set []string
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if skip[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, e)
				return
			}
			set = append(set, f.Name)
		}
	})
	return set, err
}

// FlagsOf maps the address of each field a flag of fs is bound to (the
// flag's Value is a pointer to it, as for every flag.XxxVar flag and
// StringMap and StringList, or has a Field method returning one, as
// Float64Ptr and BoolPtr) to the flag. A flag made with fs.Func is bound
// to no field: bind settings with the Var functions instead.
func FlagsOf(fs *flag.FlagSet) map[uintptr]*flag.Flag {
	m := map[uintptr]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		var target any = f.Value
		if b, ok := f.Value.(interface{ Field() any }); ok {
			target = b.Field()
		}
		if v := reflect.ValueOf(target); v.Kind() == reflect.Pointer && !v.IsNil() {
			m[v.Pointer()] = f
		}
	})
	return m
}

// Setting is one leaf of a configuration file: a scalar, list or map.
type Setting struct {
	// Path is its key in the file, sections joined by dots ("spool.dir").
	Path string
	// Value is the addressable field it decodes into.
	Value reflect.Value
}

// Scalar reports whether the setting is one value (a string, number, bool
// or duration, or a pointer to one) rather than a list or map.
func (s Setting) Scalar() bool {
	t := s.Value.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Map, reflect.Slice, reflect.Array, reflect.Struct, reflect.Interface, reflect.Func, reflect.Chan:
		return false
	}
	return true
}

// Settings lists every key a YAML file may set in root (a pointer to a
// struct), as yaml.v3 decodes it: fields by their yaml tag or lower-cased
// name, ",inline" structs merged into their parent, nested structs as
// sections, "-" skipped.
func Settings(root any) []Setting {
	var out []Setting
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for _, k := range keysOf(v) {
			f := k.value
			if f.Kind() == reflect.Struct {
				walk(f, prefix+k.key+".")
				continue
			}
			out = append(out, Setting{Path: prefix + k.key, Value: f})
		}
	}
	walk(reflect.ValueOf(root).Elem(), "")
	return out
}

// key is one YAML key of a struct and the field it decodes into.
type key struct {
	key   string
	value reflect.Value
}

// keysOf returns the YAML keys of struct v (inline fields merged), sorted.
func keysOf(v reflect.Value) []key {
	var out []key
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() && !sf.Anonymous {
			continue
		}
		tag := sf.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(","+opts+",", ",inline,") && sf.Type.Kind() == reflect.Struct {
			out = append(out, keysOf(v.Field(i))...)
			continue
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		out = append(out, key{name, v.Field(i)})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].key < out[b].key })
	return out
}

// walkNode calls leaf for every setting node n (a document or mapping
// decoded into v) sets, and returns the keys that name no setting.
func walkNode(n *yaml.Node, v reflect.Value, prefix string, leaf func(path string, v reflect.Value)) []string {
	for n.Kind == yaml.DocumentNode || n.Kind == yaml.AliasNode {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		} else if len(n.Content) == 1 {
			n = n.Content[0]
		} else {
			return nil
		}
	}
	if n.Kind != yaml.MappingNode || v.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Value{}
	for _, k := range keysOf(v) {
		fields[k.key] = k.value
	}
	var unknown []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i].Value, n.Content[i+1]
		if k == "<<" { // a merge key: the merged mappings' keys are this one's
			merged := []*yaml.Node{val}
			if val.Kind == yaml.SequenceNode {
				merged = val.Content
			}
			for _, m := range merged {
				unknown = append(unknown, walkNode(m, v, prefix, leaf)...)
			}
			continue
		}
		f, ok := fields[k]
		switch {
		case !ok:
			unknown = append(unknown, prefix+k)
		case f.Kind() == reflect.Struct:
			unknown = append(unknown, walkNode(val, f, prefix+k+".", leaf)...)
		default:
			leaf(prefix+k, f)
		}
	}
	return unknown
}
