package capture

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
)

// A WAL record's payload is the smallest faithful raw form of a finished
// call, from which Rows gives the rows the live call would have given:
//
//	version byte (walVersion)
//	endpoint byte
//	flags byte: 1 NoBodies, 2 IDs.Set, 4 IDs.HasParent, 8 Engine
//	N uvarint
//	span (16) and trace (32) ids when IDs.Set; parent (16) when HasParent
//	meta: uvarint length, then a spool batch payload holding Meta alone
//	request: uvarint length, bytes
//	body: uvarint length, bytes
//	events: uvarint count, then each data payload as uvarint length, bytes
//	engine when flag 8: kind byte, base URL as uvarint length, bytes
//	(Pending.Engine, so a replayed call gets its engine's id fallback)
//
// A streamed call keeps every data payload (the assembler's state is
// rebuilt by AddEvent at replay; the payloads are what the backend sent, so
// no second encoding of the assembled call has to be kept faithful). A
// non-streamed call has no events and its response in body.
//
// With redaction rules (Config.Redact) the raw form would put on disk what
// the rules keep out of the store, so the record holds the call's rows
// instead, assembled and redacted at Commit (appendWALRows):
//
//	version byte (walVersionRows)
//	a spool batch payload holding the rows
//
// Replayed, those rows are written as they are: the token-id fallback,
// which needs the raw request and payloads, does not run for them.
const (
	walVersion     = 1
	walVersionRows = 2
)

const (
	walFlagNoBodies = 1
	walFlagIDs      = 2
	walFlagParent   = 4
	walFlagEngine   = 8
	walFlagsKnown   = walFlagNoBodies | walFlagIDs | walFlagParent | walFlagEngine
	walMaxEndpoint  = 16
)

// errWALRecord is wrapped by every decoding error.
var errWALRecord = errors.New("capture WAL: bad record")

// walScratch is what appendWALRecord needs besides the output: a one-row
// batch for Meta's encoding.
type walScratch struct {
	batch export.Batch
	meta  []byte
}

// appendWALRecord appends p's framed record to dst: walHeader bytes for
// WAL.append to fill, then the payload.
func appendWALRecord(dst []byte, p *Pending, s *walScratch) []byte {
	dst = append(dst, make([]byte, walHeader)...)
	dst = append(dst, walVersion, byte(p.Endpoint))
	var flags byte
	if p.NoBodies {
		flags |= walFlagNoBodies
	}
	if p.IDs.Set {
		flags |= walFlagIDs
	}
	if p.IDs.HasParent {
		flags |= walFlagParent
	}
	if p.Engine.BaseURL != "" {
		flags |= walFlagEngine
	}
	dst = append(dst, flags)
	dst = binary.AppendUvarint(dst, uint64(max(p.N, 0)))
	if p.IDs.Set {
		dst = append(dst, p.IDs.Span[:]...)
		dst = append(dst, p.IDs.Trace[:]...)
	}
	if p.IDs.HasParent {
		dst = append(dst, p.IDs.Parent[:]...)
	}
	if cap(s.batch.Calls) == 0 {
		s.batch.Calls = make([]export.Call, 1)
	}
	s.batch.Calls = s.batch.Calls[:1]
	s.batch.Calls[0] = p.Meta
	s.meta = spool.AppendBatch(s.meta[:0], &s.batch)
	s.batch.Calls[0] = export.Call{}
	dst = appendWALBytes(dst, s.meta)
	dst = appendWALBytes(dst, p.Request)
	dst = appendWALBytes(dst, p.Body)
	dst = binary.AppendUvarint(dst, uint64(len(p.rawEnds)))
	start := 0
	for _, end := range p.rawEnds {
		dst = appendWALBytes(dst, p.raw[start:end])
		start = end
	}
	if p.Engine.BaseURL != "" {
		dst = append(dst, byte(p.Engine.Kind))
		dst = appendWALBytes(dst, []byte(p.Engine.BaseURL))
	}
	return dst
}

// appendWALRows appends the framed rows record of p (see walVersionRows) to
// dst: p's rows (Rows, with a as scratch for a non-streamed response),
// redacted by r.
func appendWALRows(dst []byte, p *Pending, a *Assembler, r *Redactor, s *walScratch) []byte {
	dst = append(dst, make([]byte, walHeader)...)
	dst = append(dst, walVersionRows)
	s.batch.Calls = append(s.batch.Calls[:0], Rows(p, a)...)
	for i := range s.batch.Calls {
		r.Apply(&s.batch.Calls[i], nil)
	}
	dst = spool.AppendBatch(dst, &s.batch)
	clear(s.batch.Calls)
	s.batch.Calls = s.batch.Calls[:0]
	return dst
}

func appendWALBytes[B []byte | string](dst []byte, b B) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// walDecoder reads a payload; the first error sticks.
type walDecoder struct {
	b   []byte
	err error
}

func (d *walDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errWALRecord, what)
	}
	d.b = nil
}

func (d *walDecoder) byte(what string) byte {
	if len(d.b) < 1 {
		d.fail(what + ": truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *walDecoder) uvarint(what string, limit uint64) uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(what + ": bad varint")
		return 0
	}
	if v > limit {
		d.fail(fmt.Sprintf("%s: %d exceeds %d", what, v, limit))
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *walDecoder) fixed(dst []byte, what string) {
	if len(d.b) < len(dst) {
		d.fail(what + ": truncated")
		return
	}
	copy(dst, d.b)
	d.b = d.b[len(dst):]
}

// bytes returns the next length-prefixed field; it aliases the payload.
func (d *walDecoder) bytes(what string) []byte {
	n := d.uvarint(what+" length", uint64(len(d.b)))
	if d.err == nil && n > uint64(len(d.b)) {
		d.fail(what + ": truncated")
	}
	if d.err != nil {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// decodeWALRecord fills p (empty, from AcquirePending) from a payload
// written by appendWALRecord; streamed payloads are re-assembled with
// AddEvent. It never panics and copies what p keeps.
func decodeWALRecord(payload []byte, p *Pending) error {
	if len(payload) > 0 && payload[0] == walVersionRows {
		b, err := spool.DecodeBatch(payload[1:])
		if err != nil {
			return fmt.Errorf("%w: rows: %w", errWALRecord, err)
		}
		if len(b.Calls) == 0 || b.Len() != len(b.Calls) {
			return fmt.Errorf("%w: rows record holds %d calls of %d rows, want only calls", errWALRecord, len(b.Calls), b.Len())
		}
		p.rows, p.Meta = b.Calls, b.Calls[0]
		return nil
	}
	d := walDecoder{b: payload}
	if v := d.byte("version"); d.err == nil && v != walVersion {
		return fmt.Errorf("%w: version %d (this build reads %d)", errWALRecord, v, walVersion)
	}
	ep := d.byte("endpoint")
	flags := d.byte("flags")
	if d.err == nil && (flags&^walFlagsKnown != 0 || ep >= walMaxEndpoint) {
		d.fail("unknown flags or endpoint")
	}
	n := d.uvarint("n", 1<<20)
	if d.err == nil && flags&walFlagIDs != 0 {
		d.fixed(p.IDs.Span[:], "span id")
		d.fixed(p.IDs.Trace[:], "trace id")
		p.IDs.Set = true
	}
	if d.err == nil && flags&walFlagParent != 0 {
		d.fixed(p.IDs.Parent[:], "parent span id")
		p.IDs.HasParent = true
	}
	meta := d.bytes("meta")
	req := d.bytes("request")
	body := d.bytes("body")
	events := d.uvarint("events", uint64(len(d.b)))
	if d.err != nil {
		return d.err
	}
	b, err := spool.DecodeBatch(meta)
	if err != nil {
		return fmt.Errorf("%w: meta: %w", errWALRecord, err)
	}
	if len(b.Calls) != 1 || b.Len() != 1 {
		return fmt.Errorf("%w: meta holds %d rows, want one call", errWALRecord, b.Len())
	}
	p.Meta = b.Calls[0]
	p.Endpoint = openai.Endpoint(ep)
	p.NoBodies = flags&walFlagNoBodies != 0
	p.N = int(n)
	p.Request = string(req)
	p.Body = append(p.Body[:0], body...)
	for range events {
		data := d.bytes("event")
		if d.err != nil {
			return d.err
		}
		p.AddEvent(data)
	}
	if flags&walFlagEngine != 0 {
		kind := d.byte("engine kind")
		base := d.bytes("engine base URL")
		if d.err != nil {
			return d.err
		}
		if len(base) == 0 {
			return fmt.Errorf("%w: engine without a base URL", errWALRecord)
		}
		p.Engine = engines.Replica{Kind: openai.Kind(kind), BaseURL: string(base)}
	}
	if len(d.b) > 0 {
		return fmt.Errorf("%w: %d bytes after the last field", errWALRecord, len(d.b))
	}
	return nil
}
