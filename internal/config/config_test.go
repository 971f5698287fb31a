package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// inner is a component with its own section.
type inner struct {
	Size  int           `yaml:"size"`
	Every time.Duration `yaml:"every"`
}

func (c *inner) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Size, "inner-size", 8, "")
	fs.DurationVar(&c.Every, "inner-every", time.Second, "")
}

// top is a component inlined at the top level.
type top struct {
	Name    string            `yaml:"name"`
	On      bool              `yaml:"on"`
	Ratio   float64           `yaml:"ratio"`
	Headers map[string]string `yaml:"headers"`
	Hidden  string            `yaml:"-"`
	Untag   int
	Temp    *float64 `yaml:"temp"`
	Logp    *bool    `yaml:"logp"`
	Force   []string `yaml:"force"`
}

func (c *top) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "dflt", "")
	fs.BoolVar(&c.On, "on", true, "")
	fs.Float64Var(&c.Ratio, "ratio", 0.5, "")
	StringMapVar(fs, &c.Headers, "headers", "")
	fs.IntVar(&c.Untag, "untag", 3, "")
	Float64PtrVar(fs, &c.Temp, "temp", "")
	BoolPtrVar(fs, &c.Logp, "logp", "")
	StringListVar(fs, &c.Force, "force", "")
}

type root struct {
	Top   top      `yaml:",inline"`
	Inner inner    `yaml:"inner"`
	List  []string `yaml:"list"`
	Path  string   `yaml:"-"`
}

func newRoot() (*root, *flag.FlagSet) {
	r := &root{}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r.Top.RegisterFlags(fs)
	r.Inner.RegisterFlags(fs)
	fs.StringVar(&r.Path, "config", "", "")
	return r, fs
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrecedence: each setting takes the command line over the environment
// over the file over the default, for scalars, a nested section, a bool
// whose default is true, and a map.
func TestPrecedence(t *testing.T) {
	file := "name: file\non: false\nratio: 0.25\nheaders: {a: file}\nuntag: 5\ninner:\n  size: 16\n  every: 2s\nlist: [x, y]\n"
	type want struct {
		name    string
		on      bool
		ratio   float64
		size    int
		every   time.Duration
		headers map[string]string
		untag   int
	}
	f := func(t *testing.T, file string, env map[string]string, args []string, w want) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		r, fs := newRoot()
		if file != "" {
			args = append([]string{"--config", writeFile(t, file)}, args...)
		}
		if _, err := Load(fs, args, "config", r); err != nil {
			t.Fatal(err)
		}
		got := want{r.Top.Name, r.Top.On, r.Top.Ratio, r.Inner.Size, r.Inner.Every, r.Top.Headers, r.Top.Untag}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("got %+v\nwant %+v", got, w)
		}
		if strings.Contains(file, "list:") && !slices.Equal(r.List, []string{"x", "y"}) {
			t.Fatalf("list from the file: %q", r.List)
		}
	}
	t.Run("defaults", func(t *testing.T) {
		f(t, "", nil, nil, want{"dflt", true, 0.5, 8, time.Second, nil, 3})
	})
	t.Run("file over defaults", func(t *testing.T) {
		f(t, file, nil, nil, want{"file", false, 0.25, 16, 2 * time.Second, map[string]string{"a": "file"}, 5})
	})
	t.Run("file leaves unset keys at their defaults", func(t *testing.T) {
		f(t, "inner:\n  size: 32\n", nil, nil, want{"dflt", true, 0.5, 32, time.Second, nil, 3})
	})
	t.Run("environment over file", func(t *testing.T) {
		env := map[string]string{"ROLLGATE_NAME": "env", "ROLLGATE_ON": "true", "ROLLGATE_INNER_EVERY": "3s", "ROLLGATE_HEADERS": "b=env"}
		f(t, file, env, nil, want{"env", true, 0.25, 16, 3 * time.Second, map[string]string{"b": "env"}, 5})
	})
	t.Run("flag over environment over file", func(t *testing.T) {
		env := map[string]string{"ROLLGATE_NAME": "env", "ROLLGATE_INNER_SIZE": "64"}
		args := []string{"--name", "flag", "--on=false", "--ratio", "0.75", "--headers", "c=flag,d=2"}
		f(t, file, env, args, want{"flag", false, 0.75, 64, 2 * time.Second, map[string]string{"c": "flag", "d": "2"}, 5})
	})
	t.Run("flag over default without file", func(t *testing.T) {
		f(t, "", nil, []string{"--inner-size", "1", "--on=false"}, want{"dflt", false, 0.5, 1, time.Second, nil, 3})
	})
	t.Run("zero in the file is a value", func(t *testing.T) {
		f(t, "ratio: 0\ninner: {size: 0}\n", nil, nil, want{"dflt", true, 0, 0, time.Second, nil, 3})
	})
}

// TestSources: Load reports where each value came from.
func TestSources(t *testing.T) {
	t.Setenv("ROLLGATE_RATIO", "0.1")
	t.Setenv("ROLLGATE_INNER_SIZE", "2") // the flag wins
	r, fs := newRoot()
	p := writeFile(t, "name: f\nratio: 0.2\ninner: {every: 1m}\nlist: [a]\n")
	res, err := Load(fs, []string{"--config", p, "--inner-size", "4"}, "config", r)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Source{"config": Flag, "name": File, "ratio": Env, "inner-every": File, "inner-size": Flag}
	if !reflect.DeepEqual(res.Sources, want) {
		t.Fatalf("sources %v, want %v", res.Sources, want)
	}
	if res.Explicit("on") || !res.Explicit("name") {
		t.Fatal("Explicit disagrees with Sources")
	}
	if r.Inner.Size != 4 || r.Top.Ratio != 0.1 || r.Inner.Every != time.Minute {
		t.Fatalf("values %+v", r)
	}
}

// TestConfigPathFromEnvironment: the file's path is itself a setting.
func TestConfigPathFromEnvironment(t *testing.T) {
	t.Setenv("ROLLGATE_CONFIG", writeFile(t, "name: from-env-file\n"))
	r, fs := newRoot()
	if _, err := Load(fs, nil, "config", r); err != nil {
		t.Fatal(err)
	}
	if r.Top.Name != "from-env-file" {
		t.Fatalf("name %q", r.Top.Name)
	}
}

// TestUnknownKeysAndMerge: keys that name no setting are reported (with
// their section), merge keys are followed, an empty file sets nothing.
func TestUnknownKeysAndMerge(t *testing.T) {
	r, fs := newRoot()
	p := writeFile(t, "base: &b {size: 7}\nnmae: typo\ninner:\n  <<: *b\n  evry: 1s\n")
	res, err := Load(fs, []string{"--config", p}, "config", r)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Unknown, []string{"base", "nmae", "inner.evry"}) {
		t.Fatalf("unknown %q", res.Unknown)
	}
	if r.Inner.Size != 7 || res.Sources["inner-size"] != File {
		t.Fatalf("merged size %d from %v", r.Inner.Size, res.Sources["inner-size"])
	}
	r, fs = newRoot()
	if _, err := Load(fs, []string{"--config", writeFile(t, "")}, "config", r); err != nil || r.Top.Name != "dflt" {
		t.Fatalf("empty file: %v, name %q", err, r.Top.Name)
	}
}

// TestErrors name the file or the variable at fault.
func TestErrors(t *testing.T) {
	f := func(env, file string, args []string, want string) {
		t.Helper()
		if env != "" {
			k, v, _ := strings.Cut(env, "=")
			t.Setenv(k, v)
		}
		if file != "" {
			args = append(args, "--config", writeFile(t, file))
		}
		r, fs := newRoot()
		_, err := Load(fs, args, "config", r)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want it to contain %q", err, want)
		}
	}
	f("", "", []string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, "reading config")
	f("", "inner: {size: many}\n", nil, "parsing ")
	f("", "name: [unclosed\n", nil, "parsing ")
	f("ROLLGATE_INNER_SIZE=lots", "", nil, `ROLLGATE_INNER_SIZE="lots"`)
	f("", "", []string{"--no-such-flag"}, "no-such-flag")
	r, fs := newRoot()
	if _, err := Load(fs, []string{"-h"}, "config", r); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

// TestSettings lists a file's keys as yaml.v3 decodes them, and FlagsOf
// finds the flag bound to each.
func TestSettings(t *testing.T) {
	r, fs := newRoot()
	flags := FlagsOf(fs)
	var got []string
	for _, s := range Settings(r) {
		name := "-"
		if f := flags[s.Value.Addr().Pointer()]; f != nil {
			name = f.Name
		}
		got = append(got, s.Path+"="+name+map[bool]string{true: "", false: " (list)"}[s.Scalar()])
	}
	want := []string{"force=force (list)", "headers=headers (list)", "inner.every=inner-every", "inner.size=inner-size", "list=- (list)", "logp=logp", "name=name", "on=on", "ratio=ratio", "temp=temp", "untag=untag"}
	if !slices.Equal(got, want) {
		t.Fatalf("settings\n%q\nwant\n%q", got, want)
	}
}

// TestOptionalAndListValues: pointer settings stay nil until a source
// sets them; a list from the file is replaced by the environment's.
func TestOptionalAndListValues(t *testing.T) {
	r, fs := newRoot()
	if _, err := Load(fs, nil, "config", r); err != nil || r.Top.Temp != nil || r.Top.Logp != nil || r.Top.Force != nil {
		t.Fatalf("unset: %v %v %v %v", err, r.Top.Temp, r.Top.Logp, r.Top.Force)
	}
	t.Setenv("ROLLGATE_FORCE", "b, c,")
	r, fs = newRoot()
	p := writeFile(t, "temp: 0.7\nlogp: true\nforce: [a]\n")
	res, err := Load(fs, []string{"--config", p, "--logp=false", "--temp", "1"}, "config", r)
	if err != nil {
		t.Fatal(err)
	}
	if *r.Top.Temp != 1 || *r.Top.Logp || !slices.Equal(r.Top.Force, []string{"b", "c"}) {
		t.Fatalf("got %v %v %q", *r.Top.Temp, *r.Top.Logp, r.Top.Force)
	}
	if res.Sources["temp"] != Flag || res.Sources["force"] != Env {
		t.Fatalf("sources %v", res.Sources)
	}
	r, fs = newRoot()
	if _, err := Load(fs, []string{"--temp", "warm"}, "config", r); err == nil || !strings.Contains(err.Error(), "want a number") {
		t.Fatalf("bad number: %v", err)
	}
	if _, err := Load(fs, []string{"--logp=maybe"}, "config", r); err == nil {
		t.Fatal("bad bool accepted")
	}
}

// TestEnvName is the documented mapping.
func TestEnvName(t *testing.T) {
	if got := EnvName("capture-wal-sync-interval"); got != "ROLLGATE_CAPTURE_WAL_SYNC_INTERVAL" {
		t.Fatal(got)
	}
}

// TestStringMap: parts without "=" or with an empty key are skipped; the
// rendering is sorted; setting replaces.
func TestStringMap(t *testing.T) {
	m := map[string]string{"old": "1"}
	v := (*StringMap)(&m)
	if err := v.Set(" b=2, a=1=x ,junk,=v,"); err != nil {
		t.Fatal(err)
	}
	if v.String() != "a=1=x,b=2" {
		t.Fatalf("%q", v.String())
	}
	var nilMap *StringMap
	if nilMap.String() != "" {
		t.Fatal("nil map renders empty")
	}
}
