package deploytest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// deployDir is the absolute path of deploy/.
func deployDir(t testing.TB) string {
	t.Helper()
	d, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// tool finds a Prometheus binary on PATH or fails with the install hint.
func tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: install Debian's prometheus package "+
			"(apt-get install -y --no-install-recommends prometheus)", name)
	}
	return p
}

// TestPromtool runs the real promtool over the rule files, the scrape
// configuration and the rule unit tests.
func TestPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := filepath.Join(deployDir(t), "prometheus")
	rules, err := filepath.Glob(filepath.Join(dir, "rules", "*.yml"))
	if err != nil || len(rules) != 2 {
		t.Fatalf("rule files %v (%v), want 2", rules, err)
	}
	unit, err := filepath.Glob(filepath.Join(dir, "tests", "*.yml"))
	if err != nil || len(unit) == 0 {
		t.Fatalf("rule unit tests %v (%v)", unit, err)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"check rules", append([]string{"check", "rules"}, rules...), "SUCCESS: 14 rules found"},
		{"check config", []string{"check", "config", filepath.Join(dir, "prometheus.yml")}, "is valid prometheus config file syntax"},
		{"test rules", append([]string{"test", "rules"}, unit...), "SUCCESS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(promtool, tc.args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("promtool %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			if !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "FAILED") {
				t.Fatalf("promtool %s: output lacks %q:\n%s", strings.Join(tc.args, " "), tc.want, out)
			}
		})
	}
}
