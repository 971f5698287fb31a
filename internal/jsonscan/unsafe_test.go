package jsonscan

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestUnsafeOnlyHere: the module imports unsafe only in this package (the
// string/byte views and Index's lookup by address). Any other import of
// unsafe fails here: put the conversion in this package instead.
// (gateway/chunkpeek.go reads fasthttp's unexported chunk reader with
// reflect's read-only accessors, not unsafe.)
func TestUnsafeOnlyHere(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	found := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p != "unsafe" {
				continue
			}
			found++
			if !strings.HasPrefix(rel, "internal/jsonscan/") {
				t.Errorf("%s imports unsafe: move the conversion into internal/jsonscan", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 2 { // this package's own uses, so the walk is known to see files
		t.Fatalf("found %d imports of unsafe; the walk missed the tree", found)
	}
}
