// Command strict decodes Kubernetes objects strictly into the k8s.io/api
// types, as the API server does for kubectl apply --validate=strict: an
// unknown or misspelt field, a duplicate field or a value of the wrong type
// fails.
//
// Usage: go run . OBJECTS.json
// OBJECTS.json is [{"where": "...", "object": {...}}, ...]. Prints one line
// per object ("ok WHERE" or "invalid WHERE: reason") and exits 1 when any
// object is invalid or of a kind it does not know.
//
// It is a module of its own (k8s.io/api is large), run by deploy/deploytest.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// kinds maps apiVersion/kind to a new value of its Go type.
var kinds = map[string]func() any{
	"v1/Namespace":                           func() any { return new(corev1.Namespace) },
	"v1/ConfigMap":                           func() any { return new(corev1.ConfigMap) },
	"v1/Secret":                              func() any { return new(corev1.Secret) },
	"v1/Service":                             func() any { return new(corev1.Service) },
	"apps/v1/Deployment":                     func() any { return new(appsv1.Deployment) },
	"apps/v1/StatefulSet":                    func() any { return new(appsv1.StatefulSet) },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"policy/v1/PodDisruptionBudget":          func() any { return new(policyv1.PodDisruptionBudget) },
	"networking.k8s.io/v1/Ingress":           func() any { return new(networkingv1.Ingress) },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return new(networkingv1.NetworkPolicy) },
}

type item struct {
	Where  string          `json:"where"`
	Object json.RawMessage `json:"object"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: strict OBJECTS.json")
		os.Exit(2)
	}
	b, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "strict:", err)
		os.Exit(2)
	}
	var items []item
	if err := json.Unmarshal(b, &items); err != nil {
		fmt.Fprintf(os.Stderr, "strict: %s: %v\n", os.Args[1], err)
		os.Exit(2)
	}
	failed := 0
	for _, it := range items {
		if err := check(it.Object); err != nil {
			fmt.Printf("invalid %s: %v\n", it.Where, err)
			failed++
			continue
		}
		fmt.Printf("ok %s\n", it.Where)
	}
	if failed > 0 {
		os.Exit(1)
	}
}

// check decodes one object strictly into the type of its apiVersion and kind.
func check(raw json.RawMessage) error {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(raw, &tm); err != nil {
		return err
	}
	newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return fmt.Errorf("unknown kind %s %s (add it to kinds in strict.go)", tm.APIVersion, tm.Kind)
	}
	return yaml.UnmarshalStrict(raw, newObj())
}
