package spool

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
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

// recordV1 is a record written by the release before rollouts rows carried
// group_id (payload version 1, made with that release's AppendRecord), of
// batchV1. Spools and write-ahead logs survive upgrades, so it must decode.
const recordV1 = "cb000000cc48af1e0101027331000272310261310274310001000000000000000001c8010000000003010203010401000000bf06656e67696e65000000000566697273740000027031026b310102723102613100077072696d617279000000000000e83f0361706909020272310261310274310772756e6e696e67117b2267726f75705f6964223a226731227d050602723102613102743109737563636565646564117b2267726f75705f6964223a226731227d050701027231026131000273700004746f6f6c0000000000000300027b7d00"

// batchV1 is what recordV1 holds: its rollouts have no GroupID (the group
// was only in metadata then).
func batchV1() *export.Batch {
	return &export.Batch{
		Calls: []export.Call{{SpanID: "s1", RolloutID: "r1", AttemptID: "a1", TaskID: "t1", SequenceID: 1, HTTPStatus: 200,
			Stream: true, PromptTokenIDs: []uint32{1, 2, 3}, ResponseTokenIDs: []uint32{4}, ResponseLogprobs: []float32{-0.5},
			TokenSource: "engine", TurnKind: "first", ParentSpanID: "p1", APIKeyName: "k1"}},
		Rewards: []export.Reward{{RolloutID: "r1", AttemptID: "a1", Name: "primary", Value: 0.75, Source: "api", TimeUnixNano: 9}},
		Rollouts: []export.Rollout{
			{RolloutID: "r1", AttemptID: "a1", TaskID: "t1", Status: "running", Metadata: `{"group_id":"g1"}`, CreatedUnixNano: 5, UpdatedUnixNano: 6},
			{RolloutID: "r1", AttemptID: "a1", TaskID: "t1", Status: "succeeded", Metadata: `{"group_id":"g1"}`, CreatedUnixNano: 5, UpdatedUnixNano: 7},
		},
		Spans: []export.Span{{RolloutID: "r1", AttemptID: "a1", SpanID: "sp", Name: "tool", StartTimeUnixNano: 3, Attributes: "{}"}},
	}
}

// TestDecodeVersion1: records of the previous payload version decode with
// GroupID "", and are written again in the current version.
func TestDecodeVersion1(t *testing.T) {
	rec, err := hex.DecodeString(recordV1)
	if err != nil {
		t.Fatal(err)
	}
	if rec[recordHeaderSize] != payloadVersionNoGroup {
		t.Fatalf("recordV1 has payload version %d", rec[recordHeaderSize])
	}
	got, n, err := DecodeRecord(rec)
	if err != nil || n != len(rec) {
		t.Fatalf("DecodeRecord(v1) = %d bytes, %v; want %d", n, err, len(rec))
	}
	if want := batchV1(); !reflect.DeepEqual(got, want) {
		t.Fatalf("v1 record:\n got %+v\nwant %+v", got, want)
	}
	again := AppendRecord(nil, got)
	if again[recordHeaderSize] != payloadVersion {
		t.Fatalf("written again with version %d, want %d", again[recordHeaderSize], payloadVersion)
	}
	if back, _, err := DecodeRecord(again); err != nil || !reflect.DeepEqual(back, got) {
		t.Fatalf("v1 batch written again: %v", err)
	}
	// The same bytes under the current version are not a valid record:
	// version 2 rows have one field more.
	p := bytes.Clone(rec[recordHeaderSize:])
	p[0] = payloadVersion
	if b, err := DecodeBatch(p); err == nil && reflect.DeepEqual(b, got) {
		t.Fatal("a v1 payload relabelled v2 decodes as the same batch")
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
	f.Add(AppendRecord(nil, &export.Batch{Rollouts: []export.Rollout{{RolloutID: "r", GroupID: "grp-1", Metadata: `{"group_id":"grp-1"}`}}}))
	v1, err := hex.DecodeString(recordV1)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(v1)
	f.Add(frame([]byte{payloadVersionNoGroup, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}))
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
