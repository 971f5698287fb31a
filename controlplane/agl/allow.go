package agl

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"github.com/rollgate/rollgate/gateway"
)

// Keywords of Config.AllowedEndpoints.
const (
	allowLoopback = "loopback" // 127.0.0.0/8, ::1 and the name localhost
	allowReplicas = "replicas" // the hosts of the operator's replicas, as the routing table has them now
	allowAny      = "*"        // any host
)

// defaultAllowed is Config.AllowedEndpoints when unset.
var defaultAllowed = []string{allowLoopback, allowReplicas}

// allowList is Config.AllowedEndpoints parsed: which hosts an endpoint
// registered with POST /api/models may name.
type allowList struct {
	shown            string // the setting as given, for errors
	any, loopback    bool
	replicas         bool
	prefixes         []netip.Prefix
	names            map[string]bool // lower-case host names
	operatorReplicas func() []string // the operator's replica URLs now
}

// parseAllowList checks the entries of agl.allowed_endpoints: "loopback",
// "replicas", "*", an IP address, a CIDR or a host name.
func parseAllowList(entries []string) (*allowList, error) {
	if entries == nil {
		entries = defaultAllowed
	}
	a := &allowList{shown: strings.Join(entries, ","), names: map[string]bool{}}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		switch lower := strings.ToLower(e); {
		case lower == allowAny:
			a.any = true
		case lower == allowLoopback:
			a.loopback = true
		case lower == allowReplicas:
			a.replicas = true
		case strings.Contains(e, "/"):
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("agl: allowed_endpoints: %q is not a CIDR like 10.0.0.0/8: %w", e, err)
			}
			a.prefixes = append(a.prefixes, p.Masked())
		default:
			if ip, err := netip.ParseAddr(e); err == nil {
				a.prefixes = append(a.prefixes, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				continue
			}
			if !validHostName(lower) {
				return nil, fmt.Errorf("agl: allowed_endpoints: %q is none of loopback, replicas, *, an IP address, a CIDR or a host name", e)
			}
			a.names[strings.TrimSuffix(lower, ".")] = true
		}
	}
	return a, nil
}

// validHostName reports whether s is a DNS name (letters, digits, '-',
// '.', '_').
func validHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// check says why endpoint may not be registered ("" when it may): it must
// be an http(s) URL without credentials whose host the list allows. The
// reason never quotes credentials.
func (a *allowList) check(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return fmt.Sprintf("endpoint %q is not an http(s) URL like http://host:8000/v1", redactURL(endpoint))
	}
	if u.User != nil {
		return "endpoint " + redactURL(endpoint) + ": credentials (user:password@) in an endpoint URL are not accepted " +
			"(they would show in metrics, captured rows and logs); serve the engine without them or behind the operator's configuration"
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Sprintf("endpoint %q: a query or fragment is not accepted; give the OpenAI base URL, like http://host:8000/v1", endpoint)
	}
	if a.allows(u.Hostname()) {
		return ""
	}
	return fmt.Sprintf("endpoint %q: host %s is not allowed by agl.allowed_endpoints (--agl-allowed-endpoints, now %q): "+
		"the operator adds the host, its IP or CIDR there (loopback and the operator's replicas are allowed by default)", endpoint, u.Hostname(), a.shown)
}

// allows reports whether an endpoint may name host (a host name or an IP
// literal, as url.URL.Hostname gives it). Names match names only: a name
// is never resolved to match a CIDR (the answer could change by the time
// the gateway dials).
func (a *allowList) allows(host string) bool {
	if a.any {
		return true
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	ip, err := netip.ParseAddr(host)
	if err == nil {
		ip = ip.Unmap().WithZone("")
		if a.loopback && ip.IsLoopback() {
			return true
		}
		for _, p := range a.prefixes {
			if p.Contains(ip) {
				return true
			}
		}
	} else {
		if a.loopback && host == "localhost" {
			return true
		}
		if a.names[host] {
			return true
		}
	}
	if a.replicas && a.operatorReplicas != nil {
		for _, r := range a.operatorReplicas() {
			if sameHost(r, host, ip) {
				return true
			}
		}
	}
	return false
}

// sameHost reports whether replica URL r is on host (ip: host parsed, when
// it is an IP literal).
func sameHost(r, host string, ip netip.Addr) bool {
	u, err := url.Parse(r)
	if err != nil {
		return false
	}
	h := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if rip, err := netip.ParseAddr(h); err == nil && ip.IsValid() {
		return rip.Unmap().WithZone("") == ip
	}
	return h == host
}

// replicaURLs lists the URLs of the replicas of a routing table.
func replicaURLs(v gateway.BackendsView) []string {
	var out []string
	for _, b := range v.Backends {
		for _, r := range b.Replicas {
			out = append(out, r.URL)
		}
	}
	return out
}

// redactURL is s without the credentials of its userinfo, for messages
// and logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			return "…@" + s[i+1:] // unparsable: keep only what follows the userinfo
		}
		return s
	}
	if u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}
