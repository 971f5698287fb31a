package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// fillAll sets every field of the struct v points to to a non-zero value
// derived from seed, so a field the codec forgets fails the round trip.
func fillAll(v reflect.Value, seed int) {
	for i := range v.NumField() {
		f := v.Field(i)
		k := seed*100 + i + 1
		switch f.Kind() {
		case reflect.String:
			f.SetString(string(rune('a'+i%26)) + "é\x00" + string(rune('0'+k%10)))
		case reflect.Uint64, reflect.Uint32, reflect.Uint16:
			f.SetUint(uint64(k) * 7)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Float64:
			f.SetFloat(-float64(k) / 3)
		case reflect.Slice:
			s := reflect.MakeSlice(f.Type(), 3, 3)
			for j := range 3 {
				switch s.Index(j).Kind() {
				case reflect.Uint32:
					s.Index(j).SetUint(uint64(k*1000 + j*200000))
				case reflect.Float32:
					s.Index(j).SetFloat(-float64(j) - 0.25)
				}
			}
			f.Set(s)
		default:
			panic("fillAll: unhandled kind " + f.Kind().String() + " of field " + v.Type().Field(i).Name)
		}
	}
}

func fullBatch() *export.Batch {
	b := &export.Batch{Calls: make([]export.Call, 2), Rewards: make([]export.Reward, 2), Rollouts: make([]export.Rollout, 1)}
	for i := range b.Calls {
		fillAll(reflect.ValueOf(&b.Calls[i]).Elem(), i)
	}
	for i := range b.Rewards {
		fillAll(reflect.ValueOf(&b.Rewards[i]).Elem(), i)
	}
	fillAll(reflect.ValueOf(&b.Rollouts[0]).Elem(), 9)
	b.Spans = make([]export.Span, 2)
	for i := range b.Spans {
		fillAll(reflect.ValueOf(&b.Spans[i]).Elem(), 20+i)
	}
	return b
}

func TestRecordRoundTrip(t *testing.T) {
	f := func(name string, in *export.Batch) {
		t.Helper()
		rec := AppendRecord([]byte("prefix"), in)
		if !bytes.HasPrefix(rec, []byte("prefix")) {
			t.Fatalf("%s: AppendRecord overwrote dst", name)
		}
		out, n, err := DecodeRecord(rec[len("prefix"):])
		if err != nil {
			t.Fatalf("%s: DecodeRecord: %v", name, err)
		}
		if n != len(rec)-len("prefix") {
			t.Fatalf("%s: n = %d, want %d", name, n, len(rec)-len("prefix"))
		}
		if !reflect.DeepEqual(out, in) {
			t.Fatalf("%s: round trip differs:\n got %+v\nwant %+v", name, out, in)
		}
	}
	f("full", fullBatch())
	f("calls only", &export.Batch{Calls: []export.Call{{SpanID: "s", SequenceID: 1 << 63, HTTPStatus: 65535, ChoiceIndex: 1<<32 - 1}}})
	f("rewards only", &export.Batch{Rewards: []export.Reward{{RolloutID: "r", Value: -0.0}}})
	f("empty", &export.Batch{})
	f("spans only", &export.Batch{Spans: []export.Span{{SpanID: "s", StatusCode: "error", EndTimeUnixNano: 1 << 63}}})
	// A record written before agent spans existed (no trailing section) still decodes.
	old := &export.Batch{Rollouts: []export.Rollout{{RolloutID: "r"}}}
	f("no span section", old)
	if p := AppendBatch(nil, old); p[len(p)-1] != 0 {
		t.Fatalf("a batch without spans must end with the rollouts section, got % x", p)
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	good := AppendRecord(nil, fullBatch())
	f := func(name string, rec []byte, want error) {
		t.Helper()
		_, _, err := DecodeRecord(rec)
		if !errors.Is(err, want) {
			t.Fatalf("%s: err = %v, want %v", name, err, want)
		}
	}
	f("empty", nil, ErrShortRecord)
	f("header only", good[:recordHeaderSize], ErrShortRecord)
	f("torn", good[:len(good)-1], ErrShortRecord)
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	f("bit flip", flipped, ErrCorruptRecord)
	zero := bytes.Clone(good)
	copy(zero, []byte{0, 0, 0, 0})
	f("zero length", zero, ErrCorruptRecord)
	huge := bytes.Clone(good)
	copy(huge, []byte{0xff, 0xff, 0xff, 0xff})
	f("huge length", huge, ErrCorruptRecord)
	// A valid checksum over an invalid payload: wrong version, then a count
	// that the remaining bytes cannot hold.
	f("bad version", frame([]byte{9, 0, 0, 0}), ErrCorruptRecord)
	f("bad count", frame([]byte{payloadVersion, 0xff, 0xff, 0x03}), ErrCorruptRecord)
	f("trailing", frame([]byte{payloadVersion, 0, 0, 0, 7}), ErrCorruptRecord)
}

// frame wraps payload in a record header with a correct checksum.
func frame(payload []byte) []byte {
	rec := make([]byte, recordHeaderSize, recordHeaderSize+len(payload))
	rec = append(rec, payload...)
	binary.LittleEndian.PutUint32(rec, uint32(len(payload)))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(payload, castagnoli))
	return rec
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, fullBatch()))
	f.Add(AppendRecord(nil, &export.Batch{}))
	f.Add(AppendRecord(nil, &export.Batch{Calls: []export.Call{{SpanID: "x", PromptTokenIDs: []uint32{1, 2, 3}}}}))
	f.Add([]byte{})
	f.Add(frame([]byte{payloadVersion, 0xff, 0xff, 0xff, 0xff, 0x0f}))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Checksums stop random input early; frame it too so the fuzzer
		// reaches the payload decoder.
		for _, rec := range [][]byte{data, frame(data)} {
			b, n, err := DecodeRecord(rec)
			if err != nil {
				if b != nil || n != 0 {
					t.Fatalf("error %v with a batch or a length", err)
				}
				continue
			}
			if n <= recordHeaderSize || n > len(rec) {
				t.Fatalf("n = %d for %d bytes", n, len(rec))
			}
			// Whatever decodes must survive a round trip unchanged (the
			// bytes may differ: fuzzed varints can be over-long).
			again, _, err := DecodeRecord(AppendRecord(nil, b))
			if err != nil || !reflect.DeepEqual(again, b) {
				t.Fatalf("round trip of a decoded batch: %v", err)
			}
		}
	})
}
