package gateway

import (
	"cmp"
	"fmt"
	"mime"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// Cross-site requests and DNS rebinding. A route that answers without a
// credential (the /api/v1 surface and the viewer when no admin token is set,
// a mounted surface such as Agent Lightning's without its key) trusts
// whoever reaches the port, and on the default loopback listener that is
// this machine. A web page the operator opens reaches the port too: through
// the browser, with requests that need no CORS preflight (text/plain, form
// and multipart bodies, or none), or from a name of the attacker's that it
// rebinds to 127.0.0.1. Such routes therefore serve only requests that
//
//   - name a loopback host, the listen or public address, the address the
//     connection came in on, or one of Config.AllowedHosts in Host;
//   - carry no Origin, or one whose host is such a host (never "null"),
//     and no "Sec-Fetch-Site: cross-site" (a top-level GET navigation to a
//     surface made of pages, the viewer, excepted: its answer goes to the
//     user, not the page that linked it);
//   - on any method but GET and HEAD, carry their body as JSON
//     (application/json or application/*+json), or no body and no
//     Content-Type: the CORS-safelisted types are what a page sends without
//     a preflight.
//
// Everything else gets 403 in the surface's error style, naming the fix,
// and counts in rollgate_calls_rejected_total{reason} (host, cross_site,
// content_type). Agent routes (/v1/..., /rollout/{r}/attempt/{a}/v1/...,
// /v1/traces, and a mounted surface's agent prefix) and monitoring are not
// checked, and nothing is checked on a surface whose credential is set:
// a request that carries the secret was not forged by a page that cannot
// know it.

// Reasons a request to a route without a credential is refused
// (rollgate_calls_rejected_total).
const (
	rejectForeignHost = "host"
	rejectCrossSite   = "cross_site"
	rejectContentType = "content_type"
)

// Refuser answers a refused request with status and msg in a surface's own
// error style.
type Refuser func(ctx *fasthttp.RequestCtx, status int, msg string)

// MountOptions say how the gateway guards a mounted surface.
type MountOptions struct {
	// Open says the surface answers without a credential (no key is
	// configured): the gateway then refuses cross-site requests and foreign
	// Hosts on it, before its handler runs (see crosssite.go).
	Open bool
	// AgentPrefix, when set, is a path prefix of the surface that carries
	// agent traffic (model calls): like the gateway's own agent routes it is
	// served whatever the Host and Origin.
	AgentPrefix string
	// Refuse writes the refusal in the surface's error style; nil answers
	// OpenAI-style.
	Refuse Refuser
	// Credential names the setting that gives the surface a credential,
	// for refusals to name as a fix ("": ROLLGATE_ADMIN_TOKEN).
	Credential string
}

// surface is how one group of routes is guarded.
type surface struct {
	open       bool    // answers without a credential: check it
	navigable  bool    // pages: a top-level GET navigation from another site is served
	refuse     Refuser // nil: OpenAI-style
	credential string  // what to set to need a credential instead ("": ROLLGATE_ADMIN_TOKEN)
}

// hostPolicy says which Host names the routes without a credential serve.
type hostPolicy struct {
	any   bool                // AllowedHosts has "*"
	names map[string]bool     // lower-case names, without a trailing dot
	ips   map[netip.Addr]bool // IP literals
}

// newHostPolicy builds the policy from Config.AllowedHosts, the listen
// address and the public URL.
func newHostPolicy(c *Config) (hostPolicy, error) {
	p := hostPolicy{names: map[string]bool{}, ips: map[netip.Addr]bool{}}
	for _, h := range c.AllowedHosts {
		e := strings.TrimSpace(h)
		if e == "*" {
			p.any = true
			continue
		}
		if !p.add(e) {
			return p, fmt.Errorf("allowed_hosts entry %q is not a host name or an IP address: give names such as gw.example.com or 10.0.0.5, "+
				"without a scheme, port or path (--allowed-hosts, ROLLGATE_ALLOWED_HOSTS; \"*\" serves every Host)", h)
		}
	}
	if host, _, err := net.SplitHostPort(c.Listen); err == nil {
		p.add(host)
	}
	if u, err := url.Parse(c.PublicURL); err == nil {
		p.add(u.Hostname())
	}
	return p, nil
}

// add allows host (a name or an IP literal, IPv6 in brackets or not) and
// reports whether it is one. Unspecified addresses (0.0.0.0, ::) name no
// host and are skipped.
func (p *hostPolicy) add(host string) bool {
	if ip, ok := hostIP(host); ok {
		if !ip.IsUnspecified() {
			p.ips[ip] = true
		}
		return true
	}
	name := normalHost(host)
	if name == "" || len(name) > 253 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	p.names[name] = true
	return true
}

// allows reports whether host (no port) may be served; local is the address
// the connection came in on (nil when unknown).
func (p *hostPolicy) allows(host string, local net.Addr) bool {
	if p.any {
		return true
	}
	if ip, ok := hostIP(host); ok {
		if ip.IsLoopback() || p.ips[ip] {
			return true
		}
		// The address the client dialled: no name was resolved, so nothing
		// was rebound (this is what --listen 0.0.0.0 is reached by).
		if ta, ok := local.(*net.TCPAddr); ok {
			if la, ok := netip.AddrFromSlice(ta.IP); ok && la.Unmap() == ip {
				return true
			}
		}
		return false
	}
	name := normalHost(host)
	return name == "localhost" || p.names[name]
}

// hostIP parses an IP literal host, IPv6 in brackets or bare (IPv4-mapped
// IPv6 as IPv4).
func hostIP(host string) (netip.Addr, bool) {
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return netip.Addr{}, false
		}
		host = host[1 : len(host)-1]
	}
	ip, err := netip.ParseAddr(host)
	return ip.Unmap(), err == nil
}

// normalHost lower-cases a host name and drops a trailing dot.
func normalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// hostOnly cuts the port off a Host header value ("[::1]:8000" → "[::1]",
// "gw:8000" → "gw"); a bare IPv6 address is kept whole.
func hostOnly(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[:i+1]
		}
		return h
	}
	if strings.Count(h, ":") == 1 {
		h, _, _ = strings.Cut(h, ":")
	}
	return h
}

// crossSiteFix ends every refusal: why, and what to change. %s is the
// surface's credential.
const crossSiteFix = " This route answers without a credential, so it serves only this machine's own clients (no web page, no rebound name). " +
	"To reach it by another name add that name to --allowed-hosts (allowed_hosts, ROLLGATE_ALLOWED_HOSTS), or set %s and send it."

// adminCredential is the credential of /api/v1 and /ui, named in refusals.
const adminCredential = "ROLLGATE_ADMIN_TOKEN"

// guarded answers ctx with a refusal, counted, and returns true when sf is
// open and ctx is a cross-site request or names a foreign Host; otherwise it
// returns false and the surface serves ctx.
func (s *Server) guarded(ctx *fasthttp.RequestCtx, sf surface) bool {
	if !sf.open {
		return false
	}
	reason, msg := s.crossSite(ctx, sf)
	if reason == "" {
		return false
	}
	s.m.CallsRejected.WithLabelValues(reason).Inc()
	s.log.Debug("refused a request to a route without a credential", "reason", reason, "path", string(ctx.Path()), "remote", ctx.RemoteAddr().String())
	refuse := sf.refuse
	if refuse == nil {
		refuse = func(ctx *fasthttp.RequestCtx, status int, msg string) {
			s.plainError(ctx, status, "permission_error", msg)
		}
	}
	refuse(ctx, fasthttp.StatusForbidden, msg+fmt.Sprintf(crossSiteFix, cmp.Or(sf.credential, adminCredential)))
	return true
}

// crossSite returns why ctx may not be served on a route without a
// credential (a reason and a message), or "" when it may.
func (s *Server) crossSite(ctx *fasthttp.RequestCtx, sf surface) (reason, msg string) {
	h := &ctx.Request.Header
	if host := string(ctx.Host()); host != "" && !s.hosts.allows(hostOnly(host), ctx.LocalAddr()) {
		return rejectForeignHost, "Host " + quoteShort(host) + " is not a loopback name or an allowed host (DNS rebinding)."
	}
	if o := h.Peek("Origin"); o != nil {
		if !s.originAllowed(string(o), ctx.LocalAddr()) {
			return rejectCrossSite, "requests from web pages of origin " + quoteShort(string(o)) + " are refused (cross-site request)."
		}
	}
	if strings.EqualFold(string(h.Peek("Sec-Fetch-Site")), "cross-site") && !(sf.navigable && isNavigation(ctx)) {
		return rejectCrossSite, "requests from web pages of another site are refused (Sec-Fetch-Site: cross-site)."
	}
	if ctx.IsGet() || ctx.IsHead() {
		return "", ""
	}
	ct := h.ContentType()
	if len(ct) == 0 {
		if len(ctx.Request.Body()) > 0 {
			return rejectContentType, "a " + string(ctx.Method()) + " body without a Content-Type is refused: send it as JSON with Content-Type: application/json (curl: -H 'Content-Type: application/json')."
		}
		return "", ""
	}
	if !isJSONType(string(ct)) {
		return rejectContentType, "Content-Type " + quoteShort(string(ct)) + " is refused on " + string(ctx.Method()) +
			" (a web page can send it without asking): send the body as JSON with Content-Type: application/json (curl: -H 'Content-Type: application/json')."
	}
	return "", ""
}

// originAllowed reports whether an Origin header names a page of an allowed
// host (http or https, any port). "null" (sandboxed or file pages) is not.
func (s *Server) originAllowed(origin string, local net.Addr) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false
	}
	return s.hosts.allows(u.Hostname(), local)
}

// isNavigation says whether ctx is a browser's top-level GET navigation
// (a link followed, an address typed): its answer is shown to the user,
// never to the page that linked it.
func isNavigation(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	return (ctx.IsGet() || ctx.IsHead()) && strings.EqualFold(string(h.Peek("Sec-Fetch-Mode")), "navigate") &&
		strings.EqualFold(string(h.Peek("Sec-Fetch-Dest")), "document")
}

// isJSONType reports whether a Content-Type is application/json or
// application/*+json (parameters such as charset allowed).
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// quoteShort quotes a client-sent value for an error message, cut to 100
// bytes.
func quoteShort(v string) string {
	return strconv.Quote(truncate(v, 100))
}
