package gateway

import (
	"bufio"
	"reflect"
	"sync"
)

// readerLayout is where bufio.Reader keeps its buffer and read and write
// positions, for readAhead (streamconn.go), which finds fasthttp's buffered
// reader of a hijacked connection by reflection: fasthttp does not export
// it. Everything is read through reflect's read-only accessors (Int, Bytes,
// Elem, Field), which the language allows on unexported fields: no unsafe,
// nothing written, and a field that is not there or has another type turns
// the read-ahead off instead of reading wrong memory.
var readerLayout = sync.OnceValue(func() (l struct {
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

// fasthttpStruct reports whether t is a pointer to a struct of fasthttp named name.
func fasthttpStruct(t reflect.Type, name string) bool {
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct &&
		t.Elem().PkgPath() == "github.com/valyala/fasthttp" && t.Elem().Name() == name
}

// bufferedIn returns the bytes the bufio.Reader br (a struct value, read in
// place) holds and has not handed out yet (what Peek(Buffered()) returns,
// without calling it). Only when readerLayout().ok.
func bufferedIn(br reflect.Value) []byte {
	l := readerLayout()
	r, w := int(br.Field(l.r).Int()), int(br.Field(l.w).Int())
	buf := br.Field(l.buf).Bytes()
	if r < 0 || r > w || w > len(buf) {
		return nil
	}
	return buf[r:w]
}
