package deploytest

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// k8sObject is one manifest object as the validators in k8svalidate read it.
type k8sObject struct {
	Where  string         `json:"where"`
	Object map[string]any `json:"object"`
}

// k8sObjects reads every Kubernetes object under deploy/k8s (the
// Kustomization, which is not an API object, excepted).
func k8sObjects(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir(t), "k8s", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/k8s: %v", err)
	}
	var out []k8sObject
	for _, f := range files {
		for i, d := range yamlDocs(t, f) {
			if d["kind"] == "Kustomization" {
				continue
			}
			name, _ := dig(d, "metadata", "name").(string)
			out = append(out, k8sObject{Where: filepath.Base(f) + "#" + strconv.Itoa(i) + " " + d["kind"].(string) + "/" + name, Object: d})
		}
	}
	return out
}

// k8sValidator runs one validator of deploy/deploytest/k8svalidate.
type k8sValidator struct {
	name string
	cmd  func(objectsFile string) *exec.Cmd
}

// k8sValidators returns the two validators, ready to run: the Kubernetes
// OpenAPI schemas (kubernetes-models on Node.js: types, required fields,
// formats) and strict decoding into the k8s.io/api types (unknown fields,
// wrong types), built once per test.
func k8sValidators(t *testing.T) []k8sValidator {
	t.Helper()
	dir, err := filepath.Abs("k8svalidate")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found on PATH: install Debian's nodejs and npm packages, or run scripts/test")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "kubernetes-models")); err != nil {
		t.Fatalf("kubernetes-models not installed: run (cd deploy/deploytest/k8svalidate && npm ci), or scripts/test (%v)", err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found on PATH: %v", err)
	}
	strict := filepath.Join(t.TempDir(), "strict")
	build := exec.Command(goBin, "build", "-o", strict, ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building k8svalidate/strict.go: %v\n%s", err, out)
	}
	return []k8sValidator{
		{"schema", func(f string) *exec.Cmd {
			c := exec.Command(node, "schema.mjs", f)
			c.Dir = dir
			return c
		}},
		{"strict", func(f string) *exec.Cmd { return exec.Command(strict, f) }},
	}
}

// runValidator validates objs and returns the verdict line of each object
// (keyed by where) and whether the validator exited 0.
func runValidator(t *testing.T, v k8sValidator, objs []k8sObject) (map[string]string, bool) {
	t.Helper()
	b, err := json.Marshal(objs)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "objects.json")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := v.cmd(f).Output()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		t.Fatalf("validator %s: %v\n%s", v.name, err, out)
	}
	verdicts := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		for _, o := range objs {
			if strings.HasPrefix(line, "ok "+o.Where) || strings.HasPrefix(line, "invalid "+o.Where+":") {
				verdicts[o.Where] = line
			}
		}
	}
	return verdicts, err == nil
}

// TestKubernetesManifestsValid validates every object of deploy/k8s with two
// real validators: the Kubernetes OpenAPI schemas compiled by the
// kubernetes-models npm package, and strict decoding into the k8s.io/api Go
// types (what kubectl apply --validate=strict rejects). Broken copies of the
// manifests prove that each validator fails on what it is there to catch.
func TestKubernetesManifestsValid(t *testing.T) {
	objs := k8sObjects(t)
	validators := k8sValidators(t)

	for _, v := range validators {
		verdicts, ok := runValidator(t, v, objs)
		for _, o := range objs {
			if got := verdicts[o.Where]; got != "ok "+o.Where {
				t.Errorf("%s: %q", v.name, got)
			}
		}
		if !ok {
			t.Errorf("%s exited non-zero on the manifests", v.name)
		}
	}

	// Broken copies of the Deployment, and what must reject each.
	var dep k8sObject
	for _, o := range objs {
		if o.Object["kind"] == "Deployment" {
			dep = o
		}
	}
	if dep.Object == nil {
		t.Fatal("no Deployment in deploy/k8s")
	}
	broken := []struct {
		name     string
		breakIt  func(d map[string]any)
		rejectBy []string
	}{
		{"misspelt field", func(d map[string]any) { dig(d, "spec").(map[string]any)["replica"] = 3 }, []string{"strict"}},
		{"string replicas", func(d map[string]any) { dig(d, "spec").(map[string]any)["replicas"] = "three" }, []string{"schema", "strict"}},
		{"container without name", func(d map[string]any) {
			delete(dig(d, "spec", "template", "spec", "containers").([]any)[0].(map[string]any), "name")
		}, []string{"schema"}},
		{"probe port as object", func(d map[string]any) {
			c := dig(d, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
			dig(c, "readinessProbe", "httpGet").(map[string]any)["port"] = map[string]any{"name": "http"}
		}, []string{"schema", "strict"}},
		{"unknown kind", func(d map[string]any) { d["kind"] = "Deploymnet" }, []string{"schema", "strict"}},
	}
	var bad []k8sObject
	for _, b := range broken {
		var cp map[string]any
		raw, _ := json.Marshal(dep.Object)
		if err := json.Unmarshal(raw, &cp); err != nil {
			t.Fatal(err)
		}
		b.breakIt(cp)
		bad = append(bad, k8sObject{Where: "broken " + b.name, Object: cp})
	}
	for _, v := range validators {
		verdicts, ok := runValidator(t, v, bad)
		if ok {
			t.Errorf("%s exited 0 on broken manifests", v.name)
		}
		for i, b := range broken {
			want := false
			for _, r := range b.rejectBy {
				want = want || r == v.name
			}
			got := verdicts[bad[i].Where]
			if want && !strings.HasPrefix(got, "invalid ") {
				t.Errorf("%s did not reject the %s: %q", v.name, b.name, got)
			}
			if !want && got == "" {
				t.Errorf("%s gave no verdict on the %s", v.name, b.name)
			}
			t.Logf("%s: %s", v.name, got)
		}
	}
}
