package backends

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
)

// UpstreamKeys holds the upstream API keys the operator configured at start,
// each paired with the backend origins it may be sent to. The environment
// is read once, when the gateway is built: the runtime API (PUT
// /api/v1/backends) can refer to a key by its variable's name, but never
// makes the gateway read another variable, nor send a key to an origin the
// operator did not pair it with.
//
// A key is paired with an origin (scheme://host:port) when a replica of the
// start-time routing table (config file, --upstream with
// ROLLGATE_UPSTREAM_API_KEY) names it with api_key_env, or when the
// config's upstream_keys allow-list lists that origin for it.
type UpstreamKeys struct {
	keys map[string]upstreamKey // by environment variable name
}

type upstreamKey struct {
	value   string
	origins map[string]bool
}

// NewUpstreamKeys reads the variables named by the start-time backends and
// by allow (variable name → origins) through getenv. An empty or unset
// variable, or an origin that is not an http(s) URL, is an error.
func NewUpstreamKeys(backends []Backend, allow map[string][]string, getenv func(string) string) (*UpstreamKeys, error) {
	k := &UpstreamKeys{keys: map[string]upstreamKey{}}
	add := func(name, rawOrigin, where string) error {
		origin, err := originOf(rawOrigin)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		e, ok := k.keys[name]
		if !ok {
			v := getenv(name)
			if v == "" {
				return fmt.Errorf("%s: environment variable %s is empty or unset (set it, or remove the reference)", where, name)
			}
			e = upstreamKey{value: v, origins: map[string]bool{}}
			k.keys[name] = e
		}
		e.origins[origin] = true
		return nil
	}
	for _, b := range backends {
		for _, r := range b.Replicas {
			if r.APIKeyEnv == "" {
				continue
			}
			if err := add(r.APIKeyEnv, r.URL, fmt.Sprintf("backend %q replica %q: api_key_env", b.Model, r.URL)); err != nil {
				return nil, err
			}
		}
	}
	names := make([]string, 0, len(allow))
	for name := range allow {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if len(allow[name]) == 0 {
			return nil, fmt.Errorf("upstream_keys: %s lists no origin: give the backend origins (e.g. https://10.0.0.5:8000) it may be sent to", name)
		}
		for _, o := range allow[name] {
			if err := add(name, o, "upstream_keys: "+name); err != nil {
				return nil, err
			}
		}
	}
	return k, nil
}

// Bearer returns the Authorization value for a replica at rawURL using the
// key named env, or an error that names what the operator must configure.
func (k *UpstreamKeys) Bearer(env, rawURL string) (string, error) {
	e, ok := k.keys[env]
	if !ok {
		return "", fmt.Errorf("api_key_env %s was not configured at start: only keys named by the start-time backends or the config's upstream_keys allow-list can be used", env)
	}
	origin, err := originOf(rawURL)
	if err != nil {
		return "", err
	}
	if !e.origins[origin] {
		return "", fmt.Errorf("api_key_env %s is not paired with %s: add that origin to upstream_keys.%s in the config file to allow it", env, origin, env)
	}
	return "Bearer " + e.value, nil
}

// originOf returns scheme://host:port of an http(s) URL, lower-cased, with
// the default port made explicit.
func originOf(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("url %q: %w", raw, err)
	}
	scheme := strings.ToLower(u.Scheme)
	if (scheme != "http" && scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("url %q: want http:// or https:// with a host", raw)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if scheme == "https" {
			port = "443"
		}
	}
	return scheme + "://" + strings.ToLower(u.Hostname()) + ":" + port, nil
}
