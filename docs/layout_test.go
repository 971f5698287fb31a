package docs

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// modulePath is the module of the repository.
const modulePath = "github.com/rollgate/rollgate"

// goPackage is what `go list -json` says of a package that these tests read.
type goPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// listPackages runs `go list -json ./...` at the repository's root.
func listPackages(t *testing.T) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = ".."
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// rel is a package's folder in the repository.
func rel(importPath string) string {
	return strings.TrimPrefix(strings.TrimPrefix(importPath, modulePath), "/")
}

// TestLayoutNamesEveryPackage fails when a Go package of the module has no
// row in README.md's layout table (issue 34: the table names every package).
func TestLayoutNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## Layout\n")
	if start < 0 {
		t.Fatal("README.md has no Layout section")
	}
	sec := s[start+1:]
	if end := strings.Index(sec[3:], "\n## "); end >= 0 {
		sec = sec[:end+3]
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(sec, -1) {
		rows[strings.TrimSuffix(m[1], "/")] = true
	}
	for _, p := range listPackages(t) {
		dir := rel(p.ImportPath)
		if !rows[dir] {
			t.Errorf("package %s has no row in README.md's layout table (a row `| `%s` | what it holds |`)", p.ImportPath, dir)
		}
	}
}

// layer is a folder's place in the flow (ARCHITECTURE.md): a package may
// import packages of its own layer or lower, never higher. internal/
// holds shared libraries, the lowest layer; testkit/ and cmd/ sit on top.
func layer(dir string) int {
	top, _, _ := strings.Cut(dir, "/")
	switch top {
	case "internal":
		return 0
	case "export":
		return 1
	case "tokenize":
		return 2
	case "bench":
		return 2 // the mock engine and load generator: export and internal only
	case "engines":
		return 3 // what rollgate knows per engine kind: gateway and capture both use it
	case "capture":
		return 4
	case "gateway":
		return 5
	case "trainer-bridge":
		return 6
	case "controlplane":
		return 7
	case "ui":
		return 8
	default: // cmd, testkit, deploy, docs
		return 9
	}
}

// TestPackagePictureHasNoUpwardArrow fails when a package imports one of a
// higher layer, or when anything but a test imports testkit/ (issue 34).
// gateway imports capture (it hands answered calls over) and the bridge
// reads export's store: both point down the flow's dependency order above.
func TestPackagePictureHasNoUpwardArrow(t *testing.T) {
	for _, p := range listPackages(t) {
		from := rel(p.ImportPath)
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, modulePath+"/") {
				continue
			}
			to := rel(imp)
			if strings.HasPrefix(to, "testkit/") && !strings.HasPrefix(from, "testkit/") {
				t.Errorf("%s imports the test kit %s outside its tests", from, to)
			}
			if layer(to) > layer(from) {
				t.Errorf("upward arrow: %s (layer %d) imports %s (layer %d)", from, layer(from), to, layer(to))
			}
		}
	}
}
