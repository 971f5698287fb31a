package gateway_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
)

// rawBackend is an engine written byte for byte by a test: it listens on
// loopback, reads each request of each connection (body included) and
// calls answer with the connection, which writes whatever the test wants;
// answer returns false to close the connection. It returns the base URL
// (…/v1) for a replica.
func rawBackend(t *testing.T, answer func(c net.Conn, req *http.Request) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if !answer(c, req) {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/v1"
}
