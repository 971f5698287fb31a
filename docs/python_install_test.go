package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestPythonInstallLine: the Python package's install line is one line. The
// README's (Training data), python/README.md's and the one scripts/test runs
// in its fresh environment (with the test extra) must agree, so the line the
// README gives is the line CI runs.
func TestPythonInstallLine(t *testing.T) {
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme, pyReadme, script := read("../README.md"), read("../python/README.md"), read("../scripts/test")
	const install, withTests = `pip install './python[parquet]'`, `pip install './python[parquet,test]'`
	if !strings.Contains(readme, install) {
		t.Errorf("README.md does not give the install line %s", install)
	}
	if !strings.Contains(pyReadme, ".venv/bin/"+install) || !strings.Contains(pyReadme, ".venv/bin/"+withTests) {
		t.Errorf("python/README.md does not give %s and %s", install, withTests)
	}
	if !regexp.MustCompile(`/bin/pip" install '\./python\[parquet,test\]'\n`).MatchString(script) {
		t.Errorf("scripts/test does not run python/README.md's line %s", withTests)
	}
	if strings.Contains(readme+pyReadme, "--no-build-isolation") {
		t.Error("a README still installs the package with --no-build-isolation (fails in a venv without setuptools: use the ordinary pip install)")
	}
}
