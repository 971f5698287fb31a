package load

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"
)

// IdleConns are keep-alive connections to a server that each made one call
// and then sit idle: agents waiting on a long environment step while the
// measured load runs beside them. The server must keep every one open (and
// whatever it holds per connection) for as long as they are held.
type IdleConns struct {
	conns []net.Conn
}

// idleDialConcurrency bounds the connections OpenIdle opens at a time.
const idleDialConcurrency = 64

// OpenIdle opens n connections to baseURL's host and sends one GET
// baseURL+path (e.g. /v1/models) on each, reading the whole answer, which
// must be 200 and must not close the connection. It fails if any cannot be
// opened; the connections opened are closed then.
func OpenIdle(ctx context.Context, baseURL, path string, n int) (*IdleConns, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("load: idle connections: base URL: %w", err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("load: idle connections: base URL %q: only http:// is supported", baseURL)
	}
	req := fmt.Sprintf("GET %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: rollgate-bench-idle\r\n\r\n", u.Path, path, u.Host)
	ic := &IdleConns{conns: make([]net.Conn, n)}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, idleDialConcurrency)
	)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := idleCall(ctx, u.Host, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("load: idle connection %d of %d: %w", i+1, n, err)
				}
				return
			}
			ic.conns[i] = c
		}()
	}
	wg.Wait()
	if first != nil {
		ic.Close()
		return nil, first
	}
	return ic, nil
}

// idleCall dials host, sends req and reads its answer.
func idleCall(ctx context.Context, host, req string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		c.Close()
		return nil, err
	case resp.StatusCode != http.StatusOK:
		c.Close()
		return nil, fmt.Errorf("answered %s", resp.Status)
	case resp.Close:
		c.Close()
		return nil, errors.New("the server closes the connection after the call (no keep-alive)")
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// Len returns the number of connections held.
func (ic *IdleConns) Len() int {
	if ic == nil {
		return 0
	}
	return len(ic.conns)
}

// StillOpen returns how many of the connections the server has not closed:
// a read that times out (nothing to read, no EOF) means open. A
// connection's unread bytes (none are expected) count it as closed.
func (ic *IdleConns) StillOpen() int {
	if ic == nil {
		return 0
	}
	open := 0
	var b [1]byte
	for _, c := range ic.conns {
		if c == nil {
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := c.Read(b[:]); errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	return open
}

// Close closes every connection.
func (ic *IdleConns) Close() {
	if ic == nil {
		return
	}
	for _, c := range ic.conns {
		if c != nil {
			c.Close()
		}
	}
}
