package gateway

import (
	"bufio"
	"bytes"
	"io"
	"reflect"
	"sync"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// chunkPeek tells whether reading a chunked backend body once more would
// return at once, from bytes fasthttp has already read off the socket.
//
// fasthttp's body stream returns one HTTP chunk per Read, and engines send
// one SSE event per chunk. When several events arrive together (the first
// tokens, the finish and usage events with [DONE], or any burst) the gateway
// would read them one by one and write each to the client with its own
// chunk and flush: one write syscall per event where nginx, reading the
// socket, writes them in one. With chunkPeek, fill keeps reading while the
// next chunk is wholly buffered, and forwards what it has in one write; it
// never waits for bytes that have not arrived.
//
// fasthttp does not export its stream's read buffer, so chunkPeek finds it
// by reflection on the types of fasthttp v1.69 (the closeReader around the
// requestStream holding the *bufio.Reader and the bytes left of the current
// chunk). When those types look different it is off (ok false) and every
// chunk is forwarded alone, as before; TestBurstForwardedInOneWrite fails
// then, so an upgrade that moves them is noticed.
type chunkPeek struct {
	br   *bufio.Reader
	left *int // bytes of the current chunk not read yet
}

// closeReaderLayout is where fasthttp's client keeps the requestStream in the
// closeReader it returns from BodyStream; streamLayout is where the
// requestStream keeps its read buffer and the bytes left of its chunk.
var (
	closeReaderLayout struct {
		once  sync.Once
		typ   reflect.Type // *fasthttp.closeReader
		inner int          // its embedded io.Reader
	}
	streamLayout struct {
		once          sync.Once
		typ           reflect.Type // *fasthttp.requestStream
		reader, chunk int          // its reader *bufio.Reader and chunkLeft int
	}
)

// fasthttpStruct reports whether t is a pointer to a struct of fasthttp named name.
func fasthttpStruct(t reflect.Type, name string) bool {
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct &&
		t.Elem().PkgPath() == "github.com/valyala/fasthttp" && t.Elem().Name() == name
}

// peekerOf returns the chunkPeek of a streamed response body as fasthttp's
// client returns it (a closeReader around a requestStream).
func peekerOf(resp *fasthttp.Response, body io.Reader) (chunkPeek, bool) {
	if body == nil || resp.Header.ContentLength() != -1 {
		return chunkPeek{}, false
	}
	l := &closeReaderLayout
	l.once.Do(func() {
		t := reflect.TypeOf(body)
		if !fasthttpStruct(t, "closeReader") {
			return
		}
		if f, ok := t.Elem().FieldByName("Reader"); ok && f.Type == reflect.TypeFor[io.Reader]() && len(f.Index) == 1 {
			l.typ, l.inner = t, f.Index[0]
		}
	})
	if l.typ == nil || reflect.TypeOf(body) != l.typ {
		return chunkPeek{}, false
	}
	v := reflect.ValueOf(body)
	if v.IsNil() {
		return chunkPeek{}, false
	}
	inner, _ := v.Elem().Field(l.inner).Interface().(io.Reader)
	return streamPeeker(inner)
}

// streamPeeker returns the chunkPeek of fasthttp's requestStream r.
func streamPeeker(r io.Reader) (chunkPeek, bool) {
	l := &streamLayout
	l.once.Do(func() {
		t := reflect.TypeOf(r)
		if !fasthttpStruct(t, "requestStream") {
			return
		}
		rd, ok1 := t.Elem().FieldByName("reader")
		cl, ok2 := t.Elem().FieldByName("chunkLeft")
		if ok1 && ok2 && rd.Type == reflect.TypeFor[*bufio.Reader]() && cl.Type == reflect.TypeFor[int]() &&
			len(rd.Index) == 1 && len(cl.Index) == 1 {
			l.typ, l.reader, l.chunk = t, rd.Index[0], cl.Index[0]
		}
	})
	if r == nil || l.typ == nil || reflect.TypeOf(r) != l.typ {
		return chunkPeek{}, false
	}
	v := reflect.ValueOf(r)
	if v.IsNil() {
		return chunkPeek{}, false
	}
	s := v.Elem()
	br := *(**bufio.Reader)(unsafe.Pointer(s.Field(l.reader).UnsafeAddr()))
	if br == nil {
		return chunkPeek{}, false
	}
	return chunkPeek{br: br, left: (*int)(unsafe.Pointer(s.Field(l.chunk).UnsafeAddr()))}, true
}

// ready reports whether the next Read returns without reading the socket:
// the rest of the current chunk and its CRLF, or a whole next chunk (size
// line, data, CRLF), is buffered. The last chunk (size 0) is never reported:
// reading it parses trailers, which may want more bytes.
func (p chunkPeek) ready() bool {
	n := p.br.Buffered()
	if n == 0 {
		return false
	}
	if left := *p.left; left > 0 {
		return n >= left+2
	}
	b, err := p.br.Peek(n) // n <= Buffered: never reads
	if err != nil {
		return false
	}
	eol := bytes.IndexByte(b, '\r')
	if eol <= 0 || eol+1 >= len(b) || b[eol+1] != '\n' {
		return false
	}
	size, digits := 0, 0
	for _, c := range b[:eol] {
		var d int
		switch {
		case '0' <= c && c <= '9':
			d = int(c - '0')
		case 'a' <= c && c <= 'f':
			d = int(c-'a') + 10
		case 'A' <= c && c <= 'F':
			d = int(c-'A') + 10
		default:
			d = -1
		}
		if d < 0 {
			break
		}
		if digits++; digits > 8 {
			return false
		}
		size = size*16 + d
	}
	if digits == 0 || size == 0 || bytes.IndexByte(b[:eol], '\n') >= 0 {
		return false
	}
	return len(b) >= eol+2+size+2
}
