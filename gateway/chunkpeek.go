package gateway

import (
	"bufio"
	"bytes"
	"io"
	"reflect"
	"sync"

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
// chunk) and of the standard library's bufio.Reader (its buffer and read and
// write positions), read-only and without unsafe. When those types look
// different it is off (ok false) and every chunk is forwarded alone, as
// before; TestBurstForwardedInOneWrite fails then, so an upgrade that moves
// them is noticed.
type chunkPeek struct {
	br   reflect.Value // the stream's bufio.Reader (a struct, read in place)
	left reflect.Value // the stream's chunkLeft: bytes of the current chunk not read yet
}

// closeReaderLayout is where fasthttp's client keeps the requestStream in the
// closeReader it returns from BodyStream; streamLayout is where the
// requestStream keeps its read buffer and the bytes left of its chunk, and
// readerLayout where bufio.Reader keeps its buffer and read and write
// positions.
//
// Everything is read through reflect's read-only accessors (Int, Bytes,
// Elem, Field), which the language allows on unexported fields: no unsafe,
// nothing written, and a field that is not there or has another type turns
// the peek off instead of reading wrong memory.
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
	readerLayout = sync.OnceValue(func() (l struct {
		ok        bool
		buf, r, w int // bufio.Reader's buf []byte and r, w int
	}) {
		t := reflect.TypeFor[bufio.Reader]()
		b, ok1 := t.FieldByName("buf")
		r, ok2 := t.FieldByName("r")
		w, ok3 := t.FieldByName("w")
		if ok1 && ok2 && ok3 && b.Type == reflect.TypeFor[[]byte]() && r.Type.Kind() == reflect.Int && w.Type.Kind() == reflect.Int &&
			len(b.Index) == 1 && len(r.Index) == 1 && len(w.Index) == 1 {
			l.ok, l.buf, l.r, l.w = true, b.Index[0], r.Index[0], w.Index[0]
		}
		return l
	})
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
	if r == nil || l.typ == nil || reflect.TypeOf(r) != l.typ || !readerLayout().ok {
		return chunkPeek{}, false
	}
	v := reflect.ValueOf(r)
	if v.IsNil() {
		return chunkPeek{}, false
	}
	s := v.Elem()
	br := s.Field(l.reader)
	if br.IsNil() {
		return chunkPeek{}, false
	}
	return chunkPeek{br: br.Elem(), left: s.Field(l.chunk)}, true
}

// buffered returns the bytes the stream's bufio.Reader holds and has not
// handed out yet (what Peek(Buffered()) returns, without calling it).
func (p chunkPeek) buffered() []byte {
	l := readerLayout()
	r, w := int(p.br.Field(l.r).Int()), int(p.br.Field(l.w).Int())
	buf := p.br.Field(l.buf).Bytes()
	if r < 0 || r > w || w > len(buf) {
		return nil
	}
	return buf[r:w]
}

// ready reports whether the next Read returns without reading the socket:
// the rest of the current chunk and its CRLF, or a whole next chunk (size
// line, data, CRLF), is buffered. The last chunk (size 0) is never reported:
// reading it parses trailers, which may want more bytes.
func (p chunkPeek) ready() bool {
	b := p.buffered()
	n := len(b)
	if n == 0 {
		return false
	}
	if left := int(p.left.Int()); left > 0 {
		return n >= left+2
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

// endBuffered reports whether the body's end, the last chunk without
// trailers ("0\r\n\r\n"), is what is buffered next: the next Read returns
// io.EOF without reading the socket.
func (p chunkPeek) endBuffered() bool {
	return p.left.Int() == 0 && bytes.HasPrefix(p.buffered(), []byte(lastChunk+emptyTrailer))
}
