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
	// payloadVersionNoGroup is the version before rollouts rows carried group_id.
	payloadVersionNoGroup = 1
)

// payloadVersion is the first byte of every payload written: the highest
// Since of export's column table (export.SpoolVersion). Version 2 added the
// rollouts rows' group_id; version 1 payloads (written by earlier releases,
// still in spools and logs after an upgrade) decode with GroupID "".
// Version 3 added llm_calls' prompt_token_source and response_token_source
// (earlier payloads decode with both "").
//
// The rule that keeps old payloads readable: a row's fields are encoded in
// the order of its table's Spool columns, and a payload of version v holds
// exactly the columns whose Since is at most v. A column added to a table
// gets Since one more than the current payloadVersion, wherever it sits in
// the table; payloadVersion follows, and payloads of every earlier version
// still decode, the new field left zero. Never change an existing column's
// Since, type or position relative to the columns of the same or older
// versions.
var payloadVersion = export.SpoolVersion()

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
// byte, then each table as a count and its rows, every field in the order
// of its table's Spool columns (export.CallTable and the others; integers
// as varints, strings and arrays length-prefixed).
func AppendBatch(dst []byte, b *export.Batch) []byte {
	dst = append(dst, payloadVersion)
	dst = appendRows(dst, callFields, b.Calls)
	dst = appendRows(dst, rewardFields, b.Rewards)
	dst = appendRows(dst, rolloutFields, b.Rollouts)
	// Agent spans came later: an optional trailing section, so records
	// written before it existed decode unchanged.
	if len(b.Spans) > 0 {
		dst = appendRows(dst, spanFields, b.Spans)
	}
	return dst
}

// field is one column of a table's spool order, as the codec needs it.
type field[R any] struct {
	get   func(*R) any
	typ   export.ColumnType
	since byte
}

// fieldsOf is tbl's spool order in a compact slice the codec walks per row.
func fieldsOf[R any](tbl *export.Table[R]) []field[R] {
	out := make([]field[R], len(tbl.Spool))
	for i, c := range tbl.Spool {
		out[i] = field[R]{get: c.Field, typ: c.Type, since: c.Since}
	}
	return out
}

var (
	callFields    = fieldsOf(export.CallTable)
	rewardFields  = fieldsOf(export.RewardTable)
	rolloutFields = fieldsOf(export.RolloutTable)
	spanFields    = fieldsOf(export.SpanTable)
)

// appendRows appends the count of rows and each row's fields in the
// table's spool order: strings length-prefixed, integers as varints, bools
// as a byte, float64 as 8 bytes, token ids as a count and varints, logprobs
// as a count and 4 bytes each.
func appendRows[R any](dst []byte, fields []field[R], rows []R) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(rows)))
	for i := range rows {
		r := &rows[i]
		for j := range fields {
			f := &fields[j]
			p := f.get(r)
			switch f.typ {
			case export.TypeString:
				dst = appendString(dst, *p.(*string))
			case export.TypeUint64:
				dst = binary.AppendUvarint(dst, *p.(*uint64))
			case export.TypeUint32:
				dst = binary.AppendUvarint(dst, uint64(*p.(*uint32)))
			case export.TypeUint16:
				dst = binary.AppendUvarint(dst, uint64(*p.(*uint16)))
			case export.TypeBool:
				if *p.(*bool) {
					dst = append(dst, 1)
				} else {
					dst = append(dst, 0)
				}
			case export.TypeFloat64:
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(*p.(*float64)))
			case export.TypeUint32s:
				dst = appendUint32s(dst, *p.(*[]uint32))
			case export.TypeFloat32s:
				v := *p.(*[]float32)
				dst = binary.AppendUvarint(dst, uint64(len(v)))
				for _, x := range v {
					dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
				}
			default:
				panic(fmt.Sprintf("spool: column type %d", f.typ))
			}
		}
	}
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
	if version < payloadVersionNoGroup || version > payloadVersion {
		return nil, fmt.Errorf("%w: payload version %d, want %d to %d (a newer rollgate wrote it? run that release to drain it)",
			ErrCorruptRecord, version, payloadVersionNoGroup, payloadVersion)
	}
	b := &export.Batch{}
	b.Calls = decodeRows(&d, callFields, version)
	b.Rewards = decodeRows(&d, rewardFields, version)
	b.Rollouts = decodeRows(&d, rolloutFields, version)
	if d.err == nil && len(d.buf) != 0 {
		if b.Spans = decodeRows(&d, spanFields, version); b.Spans == nil && d.err == nil {
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

// minRowBytes is the smallest encoding of one row of a version's payload:
// one byte per field, eight for a float64.
func minRowBytes[R any](fields []field[R], version byte) int {
	n := 0
	for _, f := range fields {
		switch {
		case f.since > version:
		case f.typ == export.TypeFloat64:
			n += 8
		default:
			n++
		}
	}
	return n
}

// decodeRows reads what appendRows wrote for a payload of version: the
// fields of the columns whose Since is at most version. Every field takes at
// least one byte, so a count larger than the remaining bytes allow is
// corrupt; this also bounds the allocations.
func decodeRows[R any](d *decoder, fields []field[R], version byte) []R {
	n := d.count(minRowBytes(fields, version))
	if n == 0 {
		return nil
	}
	rows := make([]R, n)
	for i := range rows {
		r := &rows[i]
		for j := range fields {
			f := &fields[j]
			if f.since > version {
				continue
			}
			p := f.get(r)
			switch f.typ {
			case export.TypeString:
				*p.(*string) = d.string()
			case export.TypeUint64:
				*p.(*uint64) = d.uvarint()
			case export.TypeUint32:
				*p.(*uint32) = d.uint32v()
			case export.TypeUint16:
				if v := d.uvarint(); v <= math.MaxUint16 {
					*p.(*uint16) = uint16(v)
				} else {
					d.fail("uint16")
				}
			case export.TypeBool:
				switch d.byte() {
				case 0:
				case 1:
					*p.(*bool) = true
				default:
					d.fail("bool")
				}
			case export.TypeFloat64:
				*p.(*float64) = math.Float64frombits(d.uint64())
			case export.TypeUint32s:
				*p.(*[]uint32) = d.uint32s()
			case export.TypeFloat32s:
				*p.(*[]float32) = d.float32s()
			}
		}
	}
	return rows
}

func (d *decoder) float32s() []float32 {
	n := d.count(4)
	if n == 0 {
		return nil
	}
	v := make([]float32, n)
	for i := range v {
		if len(d.buf) < 4 {
			d.fail("float32")
			break
		}
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.buf))
		d.buf = d.buf[4:]
	}
	return v
}
