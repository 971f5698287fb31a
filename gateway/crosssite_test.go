package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// crossSiteCtx builds a request as the gateway's listener on local would
// read it: method, Host, body and headers (name, value pairs).
func crossSiteCtx(method, host, body string, local net.Addr, hdr ...string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI("/api/v1/pause")
	req.Header.SetHost(host)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if body != "" {
		req.SetBodyString(body)
	}
	if local == nil {
		local = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Init2(fakeConn{local: local}, nil, true)
	req.CopyTo(&ctx.Request)
	return ctx
}

// fakeConn is a net.Conn that only knows its local address.
type fakeConn struct {
	net.Conn
	local net.Addr
}

func (c fakeConn) LocalAddr() net.Addr  { return c.local }
func (c fakeConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 5} }

// TestCrossSiteDecisions: what a route without a credential serves and what
// it refuses, and why (the reason counted in rollgate_calls_rejected_total).
func TestCrossSiteDecisions(t *testing.T) {
	cfg := Config{Listen: "10.1.2.3:8000", PublicURL: "https://gw.public.example", AllowedHosts: []string{"Trainer.Internal.", "[fd00::7]"}}
	hosts, err := newHostPolicy(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{hosts: hosts}
	wildcardLocal := &net.TCPAddr{IP: net.ParseIP("192.168.1.20"), Port: 8000}
	f := func(name string, sf surface, method, host, body string, want string, hdr ...string) {
		t.Helper()
		got, msg := s.crossSite(crossSiteCtx(method, host, body, wildcardLocal, hdr...), sf)
		if got != want {
			t.Errorf("%s: reason %q (%s), want %q", name, got, msg, want)
		}
	}
	api, pages := surface{open: true}, surface{open: true, navigable: true}
	// Hosts.
	f("localhost", api, "GET", "localhost:8000", "", "")
	f("LocalHost.", api, "GET", "LocalHost.", "", "")
	f("127.1.2.3", api, "GET", "127.1.2.3:9", "", "")
	f("[::1]", api, "GET", "[::1]:8000", "", "")
	f("bare ::1", api, "GET", "::1", "", "")
	f("IPv4-mapped loopback", api, "GET", "[::ffff:127.0.0.1]:80", "", "")
	f("the listen address", api, "GET", "10.1.2.3:8000", "", "")
	f("the public URL's host", api, "GET", "GW.public.example", "", "")
	f("an allowed name", api, "GET", "trainer.internal:8000", "", "")
	f("an allowed IPv6", api, "GET", "[fd00::7]:8000", "", "")
	f("the address the client dialled", api, "GET", "192.168.1.20:8000", "", "")
	f("no Host (HTTP/1.0)", api, "GET", "", "", "")
	f("a rebound name", api, "GET", "rebind.attacker.example", "", rejectForeignHost)
	f("a name ending like localhost", api, "GET", "evil-localhost", "", rejectForeignHost)
	f("localhost as a subdomain", api, "GET", "localhost.evil.example", "", rejectForeignHost)
	f("another private IP", api, "GET", "192.168.1.21:8000", "", rejectForeignHost)
	f("an allowed name's subdomain", api, "GET", "x.trainer.internal", "", rejectForeignHost)
	// Origins.
	f("same origin", api, "POST", "localhost:8000", "", "", "Origin", "http://localhost:8000")
	f("another loopback port", api, "POST", "localhost:8000", "", "", "Origin", "http://127.0.0.1:3000")
	f("an allowed https origin", api, "POST", "localhost:8000", "", "", "Origin", "https://trainer.internal")
	f("a foreign origin", api, "POST", "localhost:8000", "", rejectCrossSite, "Origin", "http://evil.example")
	f("Origin null", api, "POST", "localhost:8000", "", rejectCrossSite, "Origin", "null")
	f("an empty Origin", api, "GET", "localhost:8000", "", rejectCrossSite, "Origin", "")
	f("a file origin", api, "GET", "localhost:8000", "", rejectCrossSite, "Origin", "file://")
	f("an extension origin", api, "GET", "localhost:8000", "", rejectCrossSite, "Origin", "chrome-extension://localhost")
	f("userinfo in the origin", api, "GET", "localhost:8000", "", rejectCrossSite, "Origin", "http://localhost@evil.example")
	f("a foreign origin on a GET", api, "GET", "localhost:8000", "", rejectCrossSite, "Origin", "http://evil.example")
	// Sec-Fetch-Site.
	f("cross-site fetch", api, "GET", "localhost:8000", "", rejectCrossSite, "Sec-Fetch-Site", "cross-site")
	f("cross-site navigation to the API", api, "GET", "localhost:8000", "", rejectCrossSite,
		"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document")
	f("cross-site navigation to a page", pages, "GET", "localhost:8000", "", "",
		"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document")
	f("a page framed cross-site", pages, "GET", "localhost:8000", "", rejectCrossSite,
		"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "iframe")
	f("a cross-site form POST navigation", pages, "POST", "localhost:8000", "", rejectCrossSite,
		"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document")
	f("same-site", api, "GET", "localhost:8000", "", "", "Sec-Fetch-Site", "same-site")
	f("typed address", pages, "GET", "localhost:8000", "", "", "Sec-Fetch-Site", "none")
	// Content types.
	f("no body, no type", api, "POST", "localhost", "", "")
	f("JSON", api, "POST", "localhost", "{}", "", "Content-Type", "application/json")
	f("JSON with charset", api, "PUT", "localhost", "{}", "", "Content-Type", "Application/JSON; charset=utf-8")
	f("+json", api, "PATCH", "localhost", "{}", "", "Content-Type", "application/merge-patch+json")
	f("a body without a type", api, "POST", "localhost", "{}", rejectContentType)
	f("text/plain", api, "POST", "localhost", "{}", rejectContentType, "Content-Type", "text/plain;charset=UTF-8")
	f("empty text/plain", api, "POST", "localhost", "", rejectContentType, "Content-Type", "text/plain")
	f("form", api, "DELETE", "localhost", "a=1", rejectContentType, "Content-Type", "application/x-www-form-urlencoded")
	f("multipart", api, "POST", "localhost", "--x--", rejectContentType, "Content-Type", "multipart/form-data; boundary=x")
	f("text/json", api, "POST", "localhost", "{}", rejectContentType, "Content-Type", "text/json")
	f("json in a parameter only", api, "POST", "localhost", "{}", rejectContentType, "Content-Type", "text/plain; x=application/json")
	f("a broken type", api, "POST", "localhost", "{}", rejectContentType, "Content-Type", "application/json;;;=")
	f("a GET with a form type", api, "GET", "localhost", "", "", "Content-Type", "text/plain")
}

// TestCrossSiteMessages: a refusal says what was refused, quotes the
// client's value safely and names both fixes.
func TestCrossSiteMessages(t *testing.T) {
	hosts, err := newHostPolicy(&Config{Listen: "127.0.0.1:8000"})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{hosts: hosts}
	_, msg := s.crossSite(crossSiteCtx("GET", "evil.example\x01"+strings.Repeat("a", 300), "", nil), surface{open: true})
	if !strings.Contains(msg, `Host "evil.example\x01aaa`) || len(msg) > 300 {
		t.Errorf("message %q: want the Host quoted and cut", msg)
	}
	fix := fmt.Sprintf(crossSiteFix, adminCredential)
	if !strings.Contains(fix, "--allowed-hosts") || !strings.Contains(fix, "set ROLLGATE_ADMIN_TOKEN and send it") {
		t.Errorf("the fix %q must name --allowed-hosts and ROLLGATE_ADMIN_TOKEN", fix)
	}
}

// TestAllowedHostsRefusesURLs: an entry that is not a host (a URL, a port,
// a path) stops the gateway naming the setting and the value.
func TestAllowedHostsRefusesURLs(t *testing.T) {
	for _, bad := range []string{"http://gw.example/", "gw.example:8000", "gw.example/x", "", "a b", "[fe80::1"} {
		_, err := newHostPolicy(&Config{AllowedHosts: []string{bad}})
		if err == nil || !strings.Contains(err.Error(), "allowed_hosts") || !strings.Contains(err.Error(), "--allowed-hosts") {
			t.Errorf("allowed_hosts %q: %v, want an error naming the setting", bad, err)
		}
	}
	for _, good := range []string{"*", "gw.example", "GW.Example.", "10.0.0.5", "[fd00::1]", "fd00::1", "my_host"} {
		if _, err := newHostPolicy(&Config{AllowedHosts: []string{good}}); err != nil {
			t.Errorf("allowed_hosts %q: %v", good, err)
		}
	}
	p, _ := newHostPolicy(&Config{AllowedHosts: []string{"*"}})
	if !p.allows("rebind.attacker.example", nil) {
		t.Error(`allowed_hosts "*" must serve every Host`)
	}
}

// FuzzCrossSiteHost: whenever the guard serves a Host (or an Origin built
// from it), net/url reads a loopback or allowed host from it too: no
// spelling of a foreign name slips past hostOnly and hostIP.
//
//	go test -run '^$' -fuzz FuzzCrossSiteHost -fuzztime 30s ./gateway/
func FuzzCrossSiteHost(f *testing.F) {
	for _, h := range []string{"localhost:8000", "[::1]:80", "::1", "evil.example", "127.0.0.1.evil.example", "LOCALHOST.",
		"[::ffff:127.0.0.1]", "[fe80::1", "a:b:c", "localhost@evil.example", "evil.example:localhost", "trainer.internal",
		"[fe80::1%25eth0]:80", "127.1", "0x7f.0.0.1", "2130706433", "localhost%2eevil"} {
		f.Add(h)
	}
	hosts, err := newHostPolicy(&Config{Listen: "127.0.0.1:8000", AllowedHosts: []string{"trainer.internal"}})
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{hosts: hosts}
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}
	reference := func(hostname string) bool {
		name := strings.TrimSuffix(strings.ToLower(hostname), ".")
		if ip, err := netip.ParseAddr(name); err == nil {
			return ip.Unmap().IsLoopback()
		}
		return name == "localhost" || name == "trainer.internal"
	}
	f.Fuzz(func(t *testing.T, host string) {
		u, err := url.Parse("http://" + host + "/")
		if err != nil || u.Host != host || u.User != nil {
			return // not a host a client could send and a URL parser agree on
		}
		if s.hosts.allows(hostOnly(host), local) && !reference(u.Hostname()) {
			t.Fatalf("Host %q served, but net/url reads host %q", host, u.Hostname())
		}
		if s.originAllowed("http://"+host, local) && !reference(u.Hostname()) {
			t.Fatalf("Origin http://%s accepted, but net/url reads host %q", host, u.Hostname())
		}
	})
}
