package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"testing"
)

// writesConn is a net.Conn that records its writes.
type writesConn struct {
	net.Conn
	writes [][]byte
	closed bool
}

func (c *writesConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *writesConn) Close() error { c.closed = true; return nil }

// fasthttpEnd returns the writes fasthttp makes for a response's last
// chunk of data (after head, the headers when they were not sent yet),
// its write buffer flushed whenever size bytes are pending (split: the
// sizes at which the chunk is cut), then the terminating chunk and the
// empty trailer.
func fasthttpEnd(head, data []byte, split []int) [][]byte {
	chunk := append(append(append([]byte(nil), head...), fmt.Sprintf("%x\r\n", len(data))...), data...)
	chunk = append(chunk, "\r\n"...)
	var w [][]byte
	at := 0
	for _, s := range split {
		if s > at && s < len(chunk) {
			w = append(w, chunk[at:s])
			at = s
		}
	}
	w = append(w, chunk[at:])
	return append(w, []byte(lastChunk), []byte(emptyTrailer))
}

// FuzzClientConnEnd: whatever the last chunk holds and wherever the write
// buffer cuts it (even just before a data tail of "0", so that a piece of
// it reads "0\r\n" like the terminating chunk), the bytes that reach the
// socket are the bytes fasthttp wrote, in order, and they reach it in
// one write (the chunk, however cut, then the end), and the write after
// them passes unchanged.
func FuzzClientConnEnd(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream"), []byte("data: [DONE]\n\n"), uint16(0), uint16(0))
	f.Add([]byte(nil), []byte("data: x\r\n0"), uint16(12), uint16(0))
	f.Add([]byte("H"), []byte("0\r\n0"), uint16(9), uint16(8))
	f.Fuzz(func(t *testing.T, head, data []byte, s1, s2 uint16) {
		if len(data) == 0 || len(data) > maxHeld/2 || len(head) > 4096 {
			return
		}
		if len(head) > 0 { // response headers end with their first blank line
			head = append(head, "\r\n\r\n"...)
			if bytes.Index(head, []byte("\r\n\r\n")) != len(head)-4 {
				return
			}
		}
		var split []int
		for _, s := range []uint16{s1, s2} {
			if s > 0 {
				split = append(split, int(s))
			}
		}
		if len(split) == 2 && split[1] < split[0] {
			split[0], split[1] = split[1], split[0]
		}
		writes := fasthttpEnd(head, data, split)
		raw := &writesConn{}
		c := &clientConn{Conn: raw}
		c.endAfter(len(data), len(head) > 0)
		for _, w := range writes {
			if n, err := c.Write(w); err != nil || n != len(w) {
				t.Fatalf("write %q: %d, %v", w, n, err)
			}
		}
		// The next response's first write passes as it is.
		next := []byte("HTTP/1.1 200 OK\r\n")
		if _, err := c.Write(next); err != nil {
			t.Fatal(err)
		}
		want := append(bytes.Join(writes, nil), next...)
		if got := bytes.Join(raw.writes, nil); !bytes.Equal(got, want) {
			t.Fatalf("socket got %q, fasthttp wrote %q", got, want)
		}
		if len(raw.writes) != 2 {
			t.Fatalf("the last chunk and the end in %d writes: %q", len(raw.writes)-1, raw.writes)
		}
		if raw.closed {
			t.Fatal("connection closed")
		}
	})
}

// TestClientConnWriteEnd: a last chunk written with the body's end
// (writeEnd) makes fasthttp's own end vanish, also when it comes with the
// next pipelined response; anything else after it closes the connection.
func TestClientConnWriteEnd(t *testing.T) {
	raw := &writesConn{}
	c := &clientConn{Conn: raw}
	if err := c.writeEnd([]byte("5\r\nhello\r\n" + chunkedEnd)); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"0\r\n", "\r\nHTTP/1.1 200 OK\r\n"} {
		if n, err := c.Write([]byte(w)); err != nil || n != len(w) {
			t.Fatalf("write %q: %d, %v", w, n, err)
		}
	}
	if got := string(bytes.Join(raw.writes, nil)); got != "5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n" || len(raw.writes) != 2 {
		t.Fatalf("socket got %q", raw.writes)
	}

	raw = &writesConn{}
	c = &clientConn{Conn: raw}
	if err := c.writeEnd([]byte("1\r\nx\r\n" + chunkedEnd)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("1\r\ny\r\n")); !errors.Is(err, errEndFraming) || !raw.closed {
		t.Fatalf("bytes after the end: err %v, closed %v", err, raw.closed)
	}
}

// TestClientConnUnexpectedWrites: after endAfter, writes that are not the
// announced last chunk and its end are passed on unchanged (what was held
// first), and Close sends what is held.
func TestClientConnUnexpectedWrites(t *testing.T) {
	raw := &writesConn{}
	c := &clientConn{Conn: raw}
	c.endAfter(5, false)
	c.Write([]byte("5\r\nhello\r\n"))
	if len(raw.writes) != 0 {
		t.Fatalf("the announced last chunk written at once: %q", raw.writes)
	}
	c.Write([]byte("3\r\nabc\r\n")) // not the end: everything goes as it came
	if got := string(bytes.Join(raw.writes, nil)); got != "5\r\nhello\r\n3\r\nabc\r\n" {
		t.Fatalf("socket got %q", raw.writes)
	}

	raw = &writesConn{}
	c = &clientConn{Conn: raw}
	c.endAfter(5, false)
	c.Write([]byte("5\r\nhel")) // a piece of the last chunk, then the connection ends
	c.Close()
	if got := string(bytes.Join(raw.writes, nil)); got != "5\r\nhel" || !raw.closed {
		t.Fatalf("on Close the socket got %q (closed %v)", got, raw.closed)
	}

	raw = &writesConn{}
	c = &clientConn{Conn: raw}
	c.endAfter(1, true)
	big := bytes.Repeat([]byte("a"), maxHeld+1)
	c.Write(big) // headers longer than is ever held: everything goes out as it came
	c.Write([]byte("1\r\nx\r\n"))
	c.Write([]byte("0\r\n"))
	if got := bytes.Join(raw.writes, nil); !bytes.Equal(got, append(big, "1\r\nx\r\n0\r\n"...)) {
		t.Fatalf("socket got %d bytes", len(got))
	}
}
