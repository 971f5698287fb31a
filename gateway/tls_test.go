package gateway_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/gateway"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, returning the paths and a pool trusting it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rollgate-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTLSListener: with a certificate and key the gateway serves HTTPS only,
// and calls through it are proxied and captured as usual.
func TestTLSListener(t *testing.T) {
	s, _ := openSQLite(t)
	certFile, keyFile, pool := selfSigned(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.TLSCertFile, c.TLSKeyFile = certFile, keyFile })
	addr := strings.TrimPrefix(e.url, "http://")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	var res *http.Response
	var err error
	// Serve runs in a goroutine: retry until its listener answers.
	for deadline := time.Now().Add(15 * time.Second); ; {
		res, err = client.Post("https://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling interval of this wait on the listener
	}
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"choices"`) {
		t.Fatalf("HTTPS call: %d %s", res.StatusCode, body)
	}
	e.waitCalls(res.Header.Get("x-request-id"), 1)
	// Plain HTTP is not served on a TLS listener.
	if r, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody)); err == nil && r.StatusCode == 200 {
		t.Fatal("plain HTTP answered 200 on the TLS listener")
	}
}
