package jsonscan

import (
	"errors"
	"fmt"
	"unsafe"
)

// MaxDepth is how deeply objects and arrays may nest in any JSON text
// rollgate reads: request bodies on every route, upstream answers and each
// streamed event. It is counted as encoding/json counts it: `[]` is depth
// 1, `{"a":[1]}` depth 2. Real traffic stays far below it (chat requests
// with nested JSON-schema tools reach 10 to 20 levels), and it stays below
// the recursion limits of the readers the stored bodies go to (Python's
// json, 1,000; encoding/json, 10,000). Checking it before any recursive
// parser sees a text is what keeps a body of millions of '[' from
// overflowing the stack, a fatal error that recover cannot catch.
const MaxDepth = 512

// ErrTooDeep is what Validate reports for a text nested deeper than
// MaxDepth; the error names the limit.
var ErrTooDeep = fmt.Errorf("JSON nested more than %d levels deep (rollgate's limit on objects and arrays inside one another)", MaxDepth)

// ErrInvalid is what Validate reports for a text that is not valid JSON.
var ErrInvalid = errors.New("invalid JSON")

// Validate reports whether b is one valid JSON value between whitespace, as
// gjson.Valid decides it, nested at most MaxDepth deep: nil, ErrTooDeep, or
// ErrInvalid, whichever the text shows first read from the start (a syntax
// error before the 513th level is ErrInvalid). It never recurses and never
// allocates, so any input is safe; gjson.Valid is recursive and must not
// see a text Validate did not accept.
func Validate(b []byte) error {
	return (*Index)(nil).validate(b)
}

// Validate is Validate that also indexes b as Valid does (when it returns
// nil).
func (x *Index) Validate(b []byte) error {
	x.Clear()
	if len(b) > maxIndexed {
		return (*Index)(nil).validate(b)
	}
	if cap(x.ends) < len(b) {
		x.ends = make([]int32, len(b))
	}
	x.ends = x.ends[:cap(x.ends)]
	return x.validate(b)
}

// validate validates b and, when x is not nil, indexes it.
func (x *Index) validate(b []byte) error {
	i := SkipWS(b, 0)
	if i >= len(b) {
		return ErrInvalid
	}
	i, err := x.vAny(b, i)
	if err != nil {
		return err
	}
	if SkipWS(b, i) != len(b) {
		return ErrInvalid
	}
	if x != nil {
		x.base, x.n = uintptr(unsafe.Pointer(unsafe.SliceData(b))), len(b)
	}
	return nil
}
