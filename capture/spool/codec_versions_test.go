package spool

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"testing"
)

// recordV2 is batchV1 with GroupID "g1" on its rollouts as the release
// before the column table wrote it (payload version 2, hand-written
// encoders). Spools and write-ahead logs survive upgrades, so it must
// decode whatever columns later versions add.
const recordV2 = "d1000000ddeb8f980201027331000272310261310274310001000000000000000001c8010000000003010203010401000000bf06656e67696e65000000000566697273740000027031026b310102723102613100077072696d617279000000000000e83f0361706909020272310261310274310267310772756e6e696e67117b2267726f75705f6964223a226731227d050602723102613102743102673109737563636565646564117b2267726f75705f6964223a226731227d050701027231026131000273700004746f6f6c0000000000000300027b7d00"

// TestDecodeVersion2: a version 2 record decodes; while the current version
// is 2, the codec derived from the column table writes it byte for byte.
func TestDecodeVersion2(t *testing.T) {
	rec, err := hex.DecodeString(recordV2)
	if err != nil {
		t.Fatal(err)
	}
	want := batchV1()
	for i := range want.Rollouts {
		want.Rollouts[i].GroupID = "g1"
	}
	got, n, err := DecodeRecord(rec)
	if err != nil || n != len(rec) {
		t.Fatalf("DecodeRecord(v2) = %d bytes, %v; want %d", n, err, len(rec))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("v2 record:\n got %+v\nwant %+v", got, want)
	}
	if payloadVersion == 2 {
		if again := AppendRecord(nil, want); !bytes.Equal(again, rec) {
			t.Fatalf("version 2 encoding changed:\n got %x\nwant %x", again, rec)
		}
	}
}
