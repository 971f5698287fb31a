package deploytest

import (
	"bytes"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rollgate/rollgate/gateway"
)

// yamlDocs decodes every YAML document of a file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			out = append(out, d)
		}
	}
}

// dig follows keys through nested maps.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// TestComposeReferences checks deploy/compose.yaml against the files and
// names it refers to: mounted files exist, Prometheus scrapes a compose
// service, Grafana's datasource points at one, the OTLP endpoint names one.
func TestComposeReferences(t *testing.T) {
	dir := deployDir(t)
	docs := yamlDocs(t, filepath.Join(dir, "compose.yaml"))
	if len(docs) != 1 {
		t.Fatalf("compose.yaml: %d documents", len(docs))
	}
	services, _ := docs[0]["services"].(map[string]any)
	for _, want := range []string{"rollgate", "clickhouse", "prometheus", "grafana", "otel-collector"} {
		if services[want] == nil {
			t.Errorf("compose.yaml lacks service %q", want)
		}
	}
	for name, s := range services {
		vols, _ := dig(s, "volumes").([]any)
		for _, v := range vols {
			src := strings.SplitN(v.(string), ":", 2)[0]
			if !strings.HasPrefix(src, ".") {
				continue // named volume
			}
			if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, src, err)
			}
		}
		if b, ok := dig(s, "build", "dockerfile").(string); ok {
			if _, err := os.Stat(filepath.Join(dir, "..", b)); err != nil {
				t.Errorf("service %s builds from %s: %v", name, b, err)
			}
		}
	}
	host := func(u string) string {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatalf("%q: %v", u, err)
		}
		return p.Hostname()
	}
	prom := yamlDocs(t, filepath.Join(dir, "prometheus", "prometheus.yml"))[0]
	target := dig(prom["scrape_configs"].([]any)[0], "static_configs").([]any)[0].(map[string]any)["targets"].([]any)[0].(string)
	if services[strings.Split(target, ":")[0]] == nil {
		t.Errorf("Prometheus scrapes %s, not a compose service", target)
	}
	dsDoc := yamlDocs(t, filepath.Join(dir, "grafana", "provisioning", "datasources", "prometheus.yml"))[0]
	ds := dsDoc["datasources"].([]any)[0].(map[string]any)
	if services[host(ds["url"].(string))] == nil {
		t.Errorf("Grafana datasource %s is not a compose service", ds["url"])
	}
	if ds["uid"] == "" || ds["type"] != "prometheus" {
		t.Errorf("datasource %v", ds)
	}
	env := dig(services["rollgate"], "environment").(map[string]any)
	if services[host(env["ROLLGATE_OTLP_ENDPOINT"].(string))] == nil {
		t.Errorf("OTLP endpoint %s is not a compose service", env["ROLLGATE_OTLP_ENDPOINT"])
	}
	dash := yamlDocs(t, filepath.Join(dir, "grafana", "provisioning", "dashboards", "rollgate.yml"))[0]
	if p := dig(dash["providers"].([]any)[0], "options", "path"); p != "/var/lib/grafana/dashboards" {
		t.Errorf("dashboard provider path %v", p)
	}
}

// TestKubernetesManifests checks the manifests' structure: every object is
// named and namespaced, selectors match the pod labels, the probes use
// /readyz and /healthz, the kustomization lists every file, and the
// gateway configuration in the ConfigMap decodes strictly as gateway.Config
// plus serve's spool and capture sections.
func TestKubernetesManifests(t *testing.T) {
	dir := filepath.Join(deployDir(t), "k8s")
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	kinds := map[string]map[string]any{}
	for _, f := range files {
		for _, d := range yamlDocs(t, f) {
			kind, _ := d["kind"].(string)
			name, _ := dig(d, "metadata", "name").(string)
			if kind == "" || d["apiVersion"] == nil {
				t.Errorf("%s: object without apiVersion/kind", f)
				continue
			}
			if kind == "Kustomization" {
				for _, r := range d["resources"].([]any) {
					if _, err := os.Stat(filepath.Join(dir, r.(string))); err != nil {
						t.Errorf("kustomization: %v", err)
					}
				}
				continue
			}
			if name == "" {
				t.Errorf("%s: %s without a name", f, kind)
			}
			if kind != "Namespace" && dig(d, "metadata", "namespace") != "rollgate" {
				t.Errorf("%s: %s/%s not in namespace rollgate", f, kind, name)
			}
			kinds[kind+"/"+name] = d
		}
	}
	for _, want := range []string{"Deployment/rollgate", "Service/rollgate", "Service/rollgate-headless",
		"HorizontalPodAutoscaler/rollgate", "PodDisruptionBudget/rollgate", "ConfigMap/rollgate-config", "Ingress/rollgate-rollouts"} {
		if kinds[want] == nil {
			t.Fatalf("missing %s", want)
		}
	}
	dep := kinds["Deployment/rollgate"]
	podLabels := dig(dep, "spec", "template", "metadata", "labels").(map[string]any)
	matches := func(sel map[string]any) bool {
		for k, v := range sel {
			if podLabels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	for _, obj := range []struct {
		name string
		sel  any
	}{
		{"Deployment", dig(dep, "spec", "selector", "matchLabels")},
		{"Service", dig(kinds["Service/rollgate"], "spec", "selector")},
		{"headless Service", dig(kinds["Service/rollgate-headless"], "spec", "selector")},
		{"PodDisruptionBudget", dig(kinds["PodDisruptionBudget/rollgate"], "spec", "selector", "matchLabels")},
	} {
		if sel, _ := obj.sel.(map[string]any); !matches(sel) {
			t.Errorf("%s selector %v does not match the pod labels %v", obj.name, obj.sel, podLabels)
		}
	}
	c := dig(dep, "spec", "template", "spec", "containers").([]any)[0]
	if p := dig(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness probe path %v, want /readyz", p)
	}
	if p := dig(c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness probe path %v, want /healthz", p)
	}
	if ref := dig(kinds["HorizontalPodAutoscaler/rollgate"], "spec", "scaleTargetRef", "name"); ref != "rollgate" {
		t.Errorf("HPA targets %v", ref)
	}

	// The ConfigMap's gateway settings decode strictly (unknown keys fail).
	raw := dig(kinds["ConfigMap/rollgate-config"], "data", "rollgate.yaml").(string)
	var fc struct {
		Gateway gateway.Config `yaml:",inline"`
		Spool   struct {
			Dir          string `yaml:"dir"`
			MaxBytes     int64  `yaml:"max_bytes"`
			FullPolicy   string `yaml:"full_policy"`
			SyncInterval string `yaml:"sync_interval"`
		} `yaml:"spool"`
		Capture struct {
			QueueSize     int    `yaml:"queue_size"`
			Workers       int    `yaml:"workers"`
			BatchSize     int    `yaml:"batch_size"`
			FlushInterval string `yaml:"flush_interval"`
		} `yaml:"capture"`
	}
	dec := yaml.NewDecoder(strings.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil {
		t.Fatalf("ConfigMap rollgate.yaml: %v", err)
	}
	if len(fc.Gateway.Backends) == 0 || fc.Spool.Dir == "" {
		t.Errorf("ConfigMap rollgate.yaml: backends %d, spool dir %q", len(fc.Gateway.Backends), fc.Spool.Dir)
	}
}
