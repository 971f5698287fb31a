package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/rollgate/rollgate/export"
)

// Record framing on disk: a header of the payload length (uint32, little
// endian) and the CRC-32C (Castagnoli) of the payload, then the payload: one
// encoded export.Batch (see AppendBatch).
const (
	recordHeaderSize = 8
	// MaxRecordBytes bounds one record's payload; a header claiming more is
	// treated as corrupt.
	MaxRecordBytes = 1 << 30
	// payloadVersion is the first byte of every payload written. Version 2
	// added the rollouts rows' group_id; version 1 payloads (written by
	// earlier releases, still in spools and logs after an upgrade) decode
	// with GroupID "".
	payloadVersion = 2
	// payloadVersionNoGroup is the version before rollouts rows carried group_id.
	payloadVersionNoGroup = 1

	// Smallest encodings of one row: one byte per field, eight for a float64.
	minCallBytes    = 29
	minRewardBytes  = 6 + 8
	minRolloutBytes = 8 // 7 in version 1
	minSpanBytes    = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors returned by DecodeRecord.
var (
	// ErrShortRecord means the buffer ends inside a record (a torn write when
	// it is the end of a segment).
	ErrShortRecord = errors.New("spool: record truncated")
	// ErrCorruptRecord means the record's length, checksum or payload is invalid.
	ErrCorruptRecord = errors.New("spool: record corrupt")
)

// AppendRecord appends the framed record of b (header and payload) to dst.
func AppendRecord(dst []byte, b *export.Batch) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recordHeaderSize)...)
	dst = AppendBatch(dst, b)
	payload := dst[start+recordHeaderSize:]
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(payload, castagnoli))
	return dst
}

// recordLen checks the header at the start of buf and returns the full
// record length (header and payload) without reading the payload.
func recordLen(hdr []byte) (int, error) {
	if len(hdr) < recordHeaderSize {
		return 0, ErrShortRecord
	}
	n := binary.LittleEndian.Uint32(hdr)
	if n == 0 || n > MaxRecordBytes {
		return 0, fmt.Errorf("%w: payload length %d", ErrCorruptRecord, n)
	}
	return recordHeaderSize + int(n), nil
}

// checkRecord verifies the checksum of the complete record rec.
func checkRecord(rec []byte) error {
	want := binary.LittleEndian.Uint32(rec[4:])
	if got := crc32.Checksum(rec[recordHeaderSize:], castagnoli); got != want {
		return fmt.Errorf("%w: checksum %08x, header says %08x", ErrCorruptRecord, got, want)
	}
	return nil
}

// DecodeRecord decodes the record at the start of buf and returns the batch
// and the record's length. It returns ErrShortRecord when buf ends inside the
// record and an error wrapping ErrCorruptRecord when the record is invalid.
// It never panics and allocates no more than a small multiple of len(buf).
func DecodeRecord(buf []byte) (*export.Batch, int, error) {
	n, err := recordLen(buf)
	if err != nil {
		return nil, 0, err
	}
	if len(buf) < n {
		return nil, 0, ErrShortRecord
	}
	if err := checkRecord(buf[:n]); err != nil {
		return nil, 0, err
	}
	b, err := DecodeBatch(buf[recordHeaderSize:n])
	if err != nil {
		return nil, 0, err
	}
	return b, n, nil
}

// AppendBatch appends the compact binary encoding of b to dst: a version
// byte, then each table as a count and its rows, every field in declaration
// order (integers as varints, strings and arrays length-prefixed).
func AppendBatch(dst []byte, b *export.Batch) []byte {
	dst = append(dst, payloadVersion)
	dst = binary.AppendUvarint(dst, uint64(len(b.Calls)))
	for i := range b.Calls {
		dst = appendCall(dst, &b.Calls[i])
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Rewards)))
	for i := range b.Rewards {
		r := &b.Rewards[i]
		dst = appendString(dst, r.RolloutID)
		dst = appendString(dst, r.AttemptID)
		dst = binary.AppendUvarint(dst, r.SequenceID)
		dst = appendString(dst, r.Name)
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(r.Value))
		dst = appendString(dst, r.Source)
		dst = binary.AppendUvarint(dst, r.TimeUnixNano)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Rollouts)))
	for i := range b.Rollouts {
		r := &b.Rollouts[i]
		dst = appendString(dst, r.RolloutID)
		dst = appendString(dst, r.AttemptID)
		dst = appendString(dst, r.TaskID)
		dst = appendString(dst, r.GroupID)
		dst = appendString(dst, r.Status)
		dst = appendString(dst, r.Metadata)
		dst = binary.AppendUvarint(dst, r.CreatedUnixNano)
		dst = binary.AppendUvarint(dst, r.UpdatedUnixNano)
	}
	// Agent spans came later: an optional trailing section, so records
	// written before it existed decode unchanged.
	if len(b.Spans) > 0 {
		dst = binary.AppendUvarint(dst, uint64(len(b.Spans)))
		for i := range b.Spans {
			sp := &b.Spans[i]
			for _, v := range []string{sp.RolloutID, sp.AttemptID, sp.TraceID, sp.SpanID, sp.ParentSpanID, sp.Name,
				sp.Kind, sp.ServiceName, sp.ToolName, sp.ToolCallID, sp.StatusCode, sp.StatusMessage} {
				dst = appendString(dst, v)
			}
			dst = binary.AppendUvarint(dst, sp.StartTimeUnixNano)
			dst = binary.AppendUvarint(dst, sp.EndTimeUnixNano)
			dst = appendString(dst, sp.Attributes)
			dst = binary.AppendUvarint(dst, sp.ReceivedUnixNano)
		}
	}
	return dst
}

func appendCall(dst []byte, c *export.Call) []byte {
	for _, s := range [...]string{c.SpanID, c.TraceID, c.RolloutID, c.AttemptID, c.TaskID, c.AgentName} {
		dst = appendString(dst, s)
	}
	dst = binary.AppendUvarint(dst, c.SequenceID)
	dst = binary.AppendUvarint(dst, uint64(c.ChoiceIndex))
	dst = binary.AppendUvarint(dst, c.StartTimeUnixNano)
	dst = binary.AppendUvarint(dst, c.EndTimeUnixNano)
	dst = binary.AppendUvarint(dst, c.TTFTNano)
	for _, s := range [...]string{c.Endpoint, c.Model, c.Backend, c.PolicyVersion} {
		dst = appendString(dst, s)
	}
	if c.Stream {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(c.HTTPStatus))
	for _, s := range [...]string{c.Error, c.RequestBody, c.ResponseBody, c.ResponseMessage} {
		dst = appendString(dst, s)
	}
	dst = appendUint32s(dst, c.PromptTokenIDs)
	dst = appendUint32s(dst, c.ResponseTokenIDs)
	dst = binary.AppendUvarint(dst, uint64(len(c.ResponseLogprobs)))
	for _, v := range c.ResponseLogprobs {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	for _, s := range [...]string{c.TokenSource, c.TokenCheck, c.FinishReason} {
		dst = appendString(dst, s)
	}
	dst = binary.AppendUvarint(dst, uint64(c.PromptTokens))
	dst = binary.AppendUvarint(dst, uint64(c.CompletionTokens))
	dst = appendString(dst, c.TurnKind)
	dst = binary.AppendUvarint(dst, uint64(c.TurnPrefixLen))
	dst = binary.AppendUvarint(dst, c.TurnPrevSequenceID)
	dst = appendString(dst, c.ParentSpanID)
	dst = appendString(dst, c.APIKeyName)
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// appendUint32s writes a count and the values as varints (token ids are
// mostly below 2^21, so three bytes or fewer).
func appendUint32s(dst []byte, v []uint32) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	for _, x := range v {
		dst = binary.AppendUvarint(dst, uint64(x))
	}
	return dst
}

// DecodeBatch decodes a payload written by AppendBatch.
func DecodeBatch(p []byte) (*export.Batch, error) {
	d := decoder{buf: p}
	version := d.byte()
	if d.err != nil {
		return nil, d.err
	}
	if version != payloadVersion && version != payloadVersionNoGroup {
		return nil, fmt.Errorf("%w: payload version %d, want %d or %d (a newer rollgate wrote it? run that release to drain it)",
			ErrCorruptRecord, version, payloadVersionNoGroup, payloadVersion)
	}
	b := &export.Batch{}
	// Every field takes at least one byte, so a count larger than the
	// remaining bytes allow is corrupt; this also bounds the allocations.
	if n := d.count(minCallBytes); n > 0 {
		b.Calls = make([]export.Call, n)
		for i := range b.Calls {
			d.call(&b.Calls[i])
		}
	}
	if n := d.count(minRewardBytes); n > 0 {
		b.Rewards = make([]export.Reward, n)
		for i := range b.Rewards {
			r := &b.Rewards[i]
			r.RolloutID = d.string()
			r.AttemptID = d.string()
			r.SequenceID = d.uvarint()
			r.Name = d.string()
			r.Value = math.Float64frombits(d.uint64())
			r.Source = d.string()
			r.TimeUnixNano = d.uvarint()
		}
	}
	minRollout := minRolloutBytes
	if version == payloadVersionNoGroup {
		minRollout--
	}
	if n := d.count(minRollout); n > 0 {
		b.Rollouts = make([]export.Rollout, n)
		for i := range b.Rollouts {
			r := &b.Rollouts[i]
			r.RolloutID = d.string()
			r.AttemptID = d.string()
			r.TaskID = d.string()
			if version != payloadVersionNoGroup {
				r.GroupID = d.string()
			}
			r.Status = d.string()
			r.Metadata = d.string()
			r.CreatedUnixNano = d.uvarint()
			r.UpdatedUnixNano = d.uvarint()
		}
	}
	if d.err == nil && len(d.buf) != 0 {
		if n := d.count(minSpanBytes); n > 0 {
			b.Spans = make([]export.Span, n)
			for i := range b.Spans {
				sp := &b.Spans[i]
				for _, f := range []*string{&sp.RolloutID, &sp.AttemptID, &sp.TraceID, &sp.SpanID, &sp.ParentSpanID,
					&sp.Name, &sp.Kind, &sp.ServiceName, &sp.ToolName, &sp.ToolCallID, &sp.StatusCode, &sp.StatusMessage} {
					*f = d.string()
				}
				sp.StartTimeUnixNano = d.uvarint()
				sp.EndTimeUnixNano = d.uvarint()
				sp.Attributes = d.string()
				sp.ReceivedUnixNano = d.uvarint()
			}
		} else if d.err == nil {
			d.err = fmt.Errorf("%w: empty span section", ErrCorruptRecord)
		}
	}
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrCorruptRecord, len(d.buf))
	}
	if d.err != nil {
		return nil, d.err
	}
	return b, nil
}

// decoder reads fields from buf; after the first error every read returns
// zero and err keeps that error.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", ErrCorruptRecord, what)
	}
	d.buf = nil
}

func (d *decoder) byte() byte {
	if len(d.buf) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.buf[0]
	d.buf = d.buf[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) uint32v() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail("uint32")
		return 0
	}
	return uint32(v)
}

func (d *decoder) uint64() uint64 {
	if len(d.buf) < 8 {
		d.fail("uint64")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v
}

// count reads an element count and checks that the remaining input can hold
// that many elements of at least minSize bytes each.
func (d *decoder) count(minSize int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.buf)/minSize) {
		d.fail("count")
		return 0
	}
	return int(n)
}

func (d *decoder) string() string {
	n := d.count(1)
	if d.err != nil {
		return ""
	}
	s := string(d.buf[:n])
	d.buf = d.buf[n:]
	return s
}

func (d *decoder) uint32s() []uint32 {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		v[i] = d.uint32v()
	}
	return v
}

func (d *decoder) call(c *export.Call) {
	c.SpanID = d.string()
	c.TraceID = d.string()
	c.RolloutID = d.string()
	c.AttemptID = d.string()
	c.TaskID = d.string()
	c.AgentName = d.string()
	c.SequenceID = d.uvarint()
	c.ChoiceIndex = d.uint32v()
	c.StartTimeUnixNano = d.uvarint()
	c.EndTimeUnixNano = d.uvarint()
	c.TTFTNano = d.uvarint()
	c.Endpoint = d.string()
	c.Model = d.string()
	c.Backend = d.string()
	c.PolicyVersion = d.string()
	switch d.byte() {
	case 0:
	case 1:
		c.Stream = true
	default:
		d.fail("bool")
	}
	if st := d.uvarint(); st <= math.MaxUint16 {
		c.HTTPStatus = uint16(st)
	} else {
		d.fail("uint16")
	}
	c.Error = d.string()
	c.RequestBody = d.string()
	c.ResponseBody = d.string()
	c.ResponseMessage = d.string()
	c.PromptTokenIDs = d.uint32s()
	c.ResponseTokenIDs = d.uint32s()
	if n := d.count(4); n > 0 {
		c.ResponseLogprobs = make([]float32, n)
		for i := range c.ResponseLogprobs {
			if len(d.buf) < 4 {
				d.fail("float32")
				break
			}
			c.ResponseLogprobs[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.buf))
			d.buf = d.buf[4:]
		}
	}
	c.TokenSource = d.string()
	c.TokenCheck = d.string()
	c.FinishReason = d.string()
	c.PromptTokens = d.uint32v()
	c.CompletionTokens = d.uint32v()
	c.TurnKind = d.string()
	c.TurnPrefixLen = d.uint32v()
	c.TurnPrevSequenceID = d.uvarint()
	c.ParentSpanID = d.string()
	c.APIKeyName = d.string()
}
