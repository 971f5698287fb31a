package capture

import (
	"bytes"
	"sync"
)

// Event is one Server-Sent Event as split by SSEScanner.
//
// All slices point into the scanner's buffers and stay valid only until the
// next call to Feed, Next, Finish or Reset: copy what must outlive that.
type Event struct {
	// Raw holds the exact bytes of the event, including its terminating blank
	// line, to forward byte-for-byte. Concatenating the Raw of every event and
	// then Rest (or the Raw returned by Finish) gives back the stream exactly.
	// Raw may start with the LF of a CRLF whose CR ended the previous event
	// (when the CR was the last byte available at that time).
	Raw []byte
	// Data is the value of the data field; several data lines are joined with
	// "\n". Data is nil when the event has no data field (a comment-only block
	// such as a keep-alive, or a stray blank line); such events should be
	// forwarded but carry nothing to parse.
	Data []byte
	// Name is the value of the event field, nil when absent.
	Name []byte
}

// streamRetain is the capacity above which a scanner's buffer is let go
// once the event that grew it is done, instead of kept for the stream's
// life (an open stream's memory; Reset's bound for a pooled scanner is
// maxRetain).
const streamRetain = 64 << 10

// emptyData is what Event.Data holds for a data field with an empty value,
// so that it differs from nil (no data field at all).
var emptyData = []byte{}

// SSEScanner splits a byte stream into Server-Sent Events incrementally, for a
// proxy that forwards events one by one as they arrive from upstream.
//
// It follows the WHATWG event-stream grammar: lines end with "\n", "\r\n" or
// "\r" (a CRLF split across two Feed calls is handled); lines starting with
// ":" are comments; "field:value" drops one optional space after the colon;
// a line without a colon is a field with an empty value; several data lines
// are joined with "\n"; a blank line ends the event. The "id" and "retry"
// fields are parsed over and ignored, and a leading UTF-8 byte order mark is
// not stripped (inference engines never send one).
//
// Unlike a browser, the scanner also returns blocks that carry no data
// (comments, stray blank lines) so that a proxy forwards every byte.
//
// In steady state no allocation happens per event: the internal buffers are
// reused and consumed bytes are compacted away on Feed. The buffer holds at
// most one incomplete event plus the bytes of the last Feed; callers that need
// a hard bound check len(Rest()) and give up on the stream.
//
// The zero value is ready to use. An SSEScanner is not safe for concurrent use.
type SSEScanner struct {
	buf   []byte // unconsumed bytes; buf[start:] is the current (incomplete) event
	start int    // offset of the current event's first byte in buf
	pos   int    // offset of the first byte not yet split into lines
	scan  int    // buf[pos:scan] holds no line terminator (already searched)

	data    []byte // data lines of the current event, each followed by '\n'
	name    []byte // event field of the current event
	hasData bool
	hasName bool
	hasLine bool // the current event has a non-blank line
	skipLF  bool // the last line ended with CR: a following LF belongs to it

	// holder is the empty scanBufs the last Feed took buffers from (or
	// found empty): LetGo puts the buffers back in it. Taking a holder
	// from the pool there instead could take one full of another
	// scanner's buffers, which would then be lost to the garbage collector.
	holder *scanBufs
}

// scanBufs are a scanner's buffers while it lends them back (LetGo).
type scanBufs struct{ buf, data []byte }

// maxLentBuf is the largest buffer LetGo puts in the pool.
const maxLentBuf = 16 << 10

var scanBufPool = sync.Pool{New: func() any { return new(scanBufs) }}

// LetGo gives the scanner's buffers to a pool shared by all scanners when
// no event is under way (every byte fed has been returned in an event), so
// that a stream waiting for its engine holds none; the next Feed or event
// takes them again. It invalidates the slices of the events returned so far.
// It does nothing while an event is incomplete.
func (s *SSEScanner) LetGo() {
	if s.start != len(s.buf) || s.pos != len(s.buf) || len(s.data) != 0 || s.hasLine || s.hasData || s.hasName ||
		cap(s.buf) == 0 || cap(s.buf) > maxLentBuf || cap(s.data) > maxLentBuf {
		return
	}
	b := s.holder
	if b == nil {
		b = new(scanBufs)
	}
	s.holder = nil
	b.buf, b.data = s.buf[:0], s.data[:0]
	scanBufPool.Put(b)
	s.buf, s.data = nil, nil
	s.start, s.pos, s.scan = 0, 0, 0
}

// Feed appends bytes read from upstream. It invalidates the slices of the
// events returned so far.
func (s *SSEScanner) Feed(p []byte) {
	if s.buf == nil && len(p) > 0 {
		b := scanBufPool.Get().(*scanBufs)
		if b.buf != nil { // else the pool had none: buf grows below
			s.buf, s.data = b.buf, b.data
			b.buf, b.data = nil, nil
		}
		s.holder = b
	}
	if s.start > 0 {
		// Compact: drop the bytes of the events already returned. A buffer
		// one large event grew (the first chunk of a long prompt carries
		// its prompt_token_ids) is let go rather than kept for the rest of
		// the stream, whose events are small.
		rest := s.buf[s.start:]
		if cap(s.buf) > streamRetain && len(rest)+len(p) <= streamRetain/2 {
			s.buf = make([]byte, 0, max(2*(len(rest)+len(p)), 4<<10))
		}
		n := copy(s.buf[:cap(s.buf)], rest)
		s.buf = s.buf[:n]
		s.pos -= s.start
		s.scan = max(s.scan-s.start, 0)
		s.start = 0
	}
	s.buf = append(s.buf, p...)
}

// Next returns the next complete event, or false when more bytes are needed.
func (s *SSEScanner) Next() (Event, bool) {
	for s.pos < len(s.buf) {
		rest := s.buf[s.pos:]
		if s.skipLF {
			s.skipLF = false
			if rest[0] == '\n' {
				s.pos++
				continue
			}
		}
		// Find the end of the line: the first CR or LF after the bytes
		// already searched (a long line may arrive in many pieces).
		from := max(s.scan-s.pos, 0)
		i := indexEOL(rest[from:])
		if i < 0 {
			s.scan = len(s.buf)
			return Event{}, false // incomplete line
		}
		end := from + i
		cr := rest[end] == '\r'
		line := rest[:end]
		adv := end + 1
		if cr {
			if end+1 < len(rest) {
				if rest[end+1] == '\n' {
					adv++
				}
			} else {
				s.skipLF = true // the LF, if any, has not arrived yet
			}
		}
		s.pos += adv
		if len(line) == 0 {
			return s.dispatch(s.pos), true
		}
		s.field(line)
	}
	return Event{}, false
}

// Rest returns the buffered bytes of the incomplete event, for the end of the
// stream. The slice is valid until the next Feed, Next, Finish or Reset.
func (s *SSEScanner) Rest() []byte { return s.buf[s.start:] }

// Finish ends the stream: call it once Next has returned false. It parses
// the buffered bytes of the incomplete event (Rest) as if a blank line
// followed them, which tolerates a stream whose last event lacks its
// terminating blank line. Raw is exactly those bytes. ok is false when the
// bytes hold no field or comment line (nothing, or only the LF of a CRLF);
// Raw may still hold bytes to forward in that case. After Finish the scanner
// is empty. If Next was not drained, Finish returns the next complete event
// instead, like Next: call it again until ok is false.
func (s *SSEScanner) Finish() (Event, bool) {
	if ev, ok := s.Next(); ok {
		return ev, true
	}
	raw := s.buf[s.start:]
	if s.pos < len(s.buf) {
		s.field(s.buf[s.pos:]) // the last line, without its terminator
	}
	ok := s.hasLine
	ev := s.dispatch(len(s.buf))
	ev.Raw = raw
	s.pos = s.start
	s.skipLF = false
	return ev, ok
}

// Reset empties the scanner for a new stream, keeping its buffers (except
// very large ones).
func (s *SSEScanner) Reset() {
	if cap(s.buf) > maxRetain {
		s.buf = nil
	}
	if cap(s.data) > maxRetain {
		s.data = nil
	}
	s.buf = s.buf[:0]
	s.data = s.data[:0]
	s.name = s.name[:0]
	s.start, s.pos, s.scan = 0, 0, 0
	s.hasData, s.hasName, s.hasLine, s.skipLF = false, false, false, false
}

// field processes one non-blank line of the current event.
func (s *SSEScanner) field(line []byte) {
	s.hasLine = true
	if line[0] == ':' {
		return // comment
	}
	name, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) { // no allocation: compiler-optimised comparison
	case "data":
		s.data = append(s.data, value...)
		s.data = append(s.data, '\n')
		s.hasData = true
	case "event":
		s.name = append(s.name[:0], value...)
		s.hasName = true
	}
}

// dispatch returns the event ending at offset end and starts the next one.
func (s *SSEScanner) dispatch(end int) Event {
	ev := Event{Raw: s.buf[s.start:end:end]}
	if s.hasData {
		d := s.data[:len(s.data)-1] // drop the last '\n'
		if d == nil {
			d = emptyData
		}
		ev.Data = d[:len(d):len(d)]
	}
	if s.hasName {
		n := s.name
		if n == nil {
			n = emptyData
		}
		ev.Name = n[:len(n):len(n)]
	}
	s.start = end
	if cap(s.data) > streamRetain {
		s.data = nil // ev.Data keeps it as long as the caller needs it
	}
	s.data = s.data[:0]
	s.name = s.name[:0]
	s.hasData, s.hasName, s.hasLine = false, false, false
	return ev
}

// indexEOL returns the index of the first CR or LF in b, or -1.
func indexEOL(b []byte) int {
	lf := bytes.IndexByte(b, '\n')
	if lf < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if cr := bytes.IndexByte(b[:lf], '\r'); cr >= 0 {
		return cr
	}
	return lf
}
