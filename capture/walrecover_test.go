package capture

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/tokenize"
)

// killedWAL appends n records (sequence ids 0..n-1) to a WAL in dir and
// abandons it, as a killed process does; it returns the segment's path and
// the records' offsets.
func killedWAL(t *testing.T, dir string, n int) (string, []uint32) {
	t.Helper()
	w := openTestWAL(t, dir, WALConfig{})
	var offs []uint32
	var seg uint64
	for i := range n {
		ref, err := w.append(appendWALRecord(nil, pending(uint64(i)), &walScratch{}))
		if err != nil {
			t.Fatal(err)
		}
		offs, seg = append(offs, ref.off), ref.seg
	}
	return w.segPath(seg, walSuffix), offs
}

func flipByte(t *testing.T, path string, off int64, x byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= x
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

func seqs(from, to int, except ...int) []uint64 {
	var s []uint64
	for i := from; i < to; i++ {
		if !slices.Contains(except, i) {
			s = append(s, uint64(i))
		}
	}
	return s
}

// TestWALDamageSetAside: one damaged byte costs the record it is in, not
// the records after it (before: the rest of the segment, or all of it for
// the magic); the damaged bytes are kept in a 0600 quarantine file and
// counted.
func TestWALDamageSetAside(t *testing.T) {
	f := func(name string, where func(offs []uint32) int64, want []uint64) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			seg, offs := killedWAL(t, dir, 30)
			flipByte(t, seg, where(offs), 0x10)
			w := openTestWAL(t, dir, WALConfig{})
			defer w.Close()
			if got := replayed(t, w); !reflect.DeepEqual(got, want) {
				t.Fatalf("replayed %v, want %v", got, want)
			}
			if got := testutil.ToFloat64(w.corrupt); got != 1 {
				t.Fatalf("corrupt = %v, want 1", got)
			}
			q, _ := filepath.Glob(seg + ".*.quarantine")
			if len(q) != 1 {
				t.Fatalf("quarantine files %v, want 1", q)
			}
			if fi, err := os.Stat(q[0]); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("quarantine file mode: %v %v", fi.Mode(), err)
			}
		})
	}
	f("payload byte of record 3", func(o []uint32) int64 { return int64(o[3]) + walHeader + 40 }, seqs(0, 30, 3))
	f("length of record 5", func(o []uint32) int64 { return int64(o[5]) + 1 }, seqs(0, 30, 5))
	f("CRC of record 0", func(o []uint32) int64 { return int64(o[0]) + 5 }, seqs(1, 30))
	f("magic", func([]uint32) int64 { return 3 }, seqs(0, 30))
}

// TestWALLegacyAckIndices: an .ack file of an earlier release (record
// indices, no magic) still acknowledges the right records, and the first
// new acknowledgement rewrites it in the offsets format.
func TestWALLegacyAckIndices(t *testing.T) {
	dir := t.TempDir()
	seg, offs := killedWAL(t, dir, 6)
	var legacy []byte
	for _, i := range []uint32{0, 2, 3} {
		legacy = binary.LittleEndian.AppendUint32(legacy, i)
	}
	if err := os.WriteFile(strings.TrimSuffix(seg, walSuffix)+walAckSuffix, legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	w := openTestWAL(t, dir, WALConfig{})
	if got := replayed(t, w); !reflect.DeepEqual(got, []uint64{1, 4, 5}) {
		t.Fatalf("replayed %v, want [1 4 5]", got)
	}
	w.ack([]walRef{{seg: 0, off: offs[4]}})
	w2 := openTestWAL(t, dir, WALConfig{})
	if got := replayed(t, w2); !reflect.DeepEqual(got, []uint64{1, 5}) {
		t.Fatalf("after an acknowledgement in the new format: replayed %v, want [1 5]", got)
	}
}

// TestWALRedactedOnDisk: with redaction rules, no byte of the WAL holds
// what a rule removes, while the call waits in the pipeline (the sink
// hangs) and after a kill; the replayed rows are the redacted rows.
func TestWALRedactedOnDisk(t *testing.T) {
	const secret = "sk-abcdefghijklmnopqrstuvwxyz0123"
	red, err := NewRedactor([]RedactRule{{Name: "key", Pattern: `sk-[A-Za-z0-9]{20,}`, Replacement: "[REDACTED_KEY]"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sink := &memCalls{spans: map[string]int{}, block: make(chan struct{})}
	p1 := NewPipeline(Config{Workers: 1, FlushInterval: time.Millisecond, Redact: red, WAL: openTestWAL(t, dir, WALConfig{})},
		[]NamedSink{{Name: "mem", Sink: sink}}, metrics.New(), nil)
	calls := []*Pending{pending(1), streamPending(2)}
	calls[0].Meta.EndTimeUnixNano = 30 // else Commit sets it
	calls[0].Request = `{"model":"m","messages":[{"role":"user","content":"my key is ` + secret + `"}]}`
	calls[1].Request = strings.Replace(calls[1].Request, `"hi"`, `"`+secret+`"`, 1)
	// The key split over two events of the stream's answer.
	calls[1].AddEvent([]byte(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" ` + secret[:10] + `"}}]}`))
	calls[1].AddEvent([]byte(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"` + secret[10:] + `"}}]}`))
	var want [][]export.Call
	for _, c := range calls {
		var a Assembler
		rows := Rows(c, &a)
		for i := range rows {
			red.Apply(&rows[i], nil)
		}
		want = append(want, rows)
		if !p1.TryPush(c) {
			t.Fatal("refused")
		}
	}
	grepDir := func() {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			if strings.Contains(string(b), secret) || strings.Contains(string(b), secret[10:]) {
				t.Fatalf("%s holds the secret", f)
			}
		}
		if len(files) == 0 {
			t.Fatal("no WAL file")
		}
	}
	grepDir()
	// p1 is killed (abandoned); the next process replays the rows.
	w2 := openTestWAL(t, dir, WALConfig{})
	var got [][]export.Call
	if err := w2.replay(func(_ walRef, payload []byte) bool {
		q := AcquirePending()
		if err := decodeWALRecord(payload, q); err != nil {
			t.Fatal(err)
		}
		got = append(got, q.rows)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("replayed rows differ from the redacted live rows:\n got %+v\nwant %+v", got, want)
	}
	if strings.Contains(fmt.Sprint(got), secret) || !strings.Contains(fmt.Sprint(got), "[REDACTED_KEY]") {
		t.Fatal("replayed rows not redacted")
	}
	grepDir()
}

// panicFiller is an id fallback that panics: a stand-in for any defect in
// a call's assembly.
type panicFiller struct{}

func (panicFiller) Fill(context.Context, []export.Call, []byte, func(func([]byte))) (tokenize.FillOutcome, error) {
	panic("filler defect")
}

// TestWALPanickingCallSetAside: a call whose assembly panics is dropped
// and counted, not the process; its WAL record is quarantined and
// acknowledged, so the next start does not replay it again.
func TestWALPanickingCallSetAside(t *testing.T) {
	dir := t.TempDir()
	w := openTestWAL(t, dir, WALConfig{})
	m := metrics.New()
	sink := &memCalls{spans: map[string]int{}}
	p := NewPipeline(Config{Workers: 1, FlushInterval: time.Millisecond, WAL: w, Fallback: func(engines.Replica) IDFiller { return panicFiller{} }},
		[]NamedSink{{Name: "mem", Sink: sink}}, m, nil)
	c := pending(1)
	c.Body = []byte(`{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	if !p.TryPush(c) {
		t.Fatal("refused")
	}
	if !p.TryPush(pending(2)) { // engine ids: no fallback, stored
		t.Fatal("refused")
	}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.CaptureDropped); got != 1 {
		t.Fatalf("dropped = %v, want 1", got)
	}
	if got := testutil.ToFloat64(w.corrupt); got != 1 {
		t.Fatalf("WAL corrupt = %v, want 1", got)
	}
	if q, _ := filepath.Glob(filepath.Join(dir, "*.quarantine")); len(q) != 1 {
		t.Fatalf("quarantine files %v, want 1", q)
	}
	if st := w.Stats(); st.Pending != 0 {
		t.Fatalf("%d records pending, want 0 (the panicking one acknowledged)", st.Pending)
	}
	if sink.spans["s"] != 1 {
		t.Fatalf("the other call stored %d times", sink.spans["s"])
	}
}

// FuzzWALRecovery: whatever bytes of a killed process's segment are
// flipped or cut, opening the WAL never panics, and every record the
// damage did not touch is replayed, in order.
func FuzzWALRecovery(f *testing.F) {
	one := len(appendWALRecord(nil, pending(0), &walScratch{}))
	f.Add([]byte{byte(walHeader + 20), 0, 1})
	f.Add([]byte{byte(walHeader + one + 1), 0, 0x40})
	f.Add([]byte{2, 0, 'X'})
	f.Add([]byte{byte(walHeader + 2*one + 5), 0, 0xff, 1, 0, 1, 9})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, edits []byte) {
		dir := t.TempDir()
		seg, offs := killedWAL(t, dir, 5)
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		orig := slices.Clone(b)
		for ; len(edits) >= 3; edits = edits[3:] {
			b[int(binary.LittleEndian.Uint16(edits))%len(b)] ^= edits[2]
		}
		if len(edits) > 0 && int(edits[0]) < len(b) {
			b = b[:len(b)-int(edits[0])]
		}
		if err := os.WriteFile(seg, b, 0o600); err != nil {
			t.Fatal(err)
		}
		var want []uint64
		for i, o := range offs {
			end := int(o) + one
			if end <= len(b) && string(b[o:end]) == string(orig[o:end]) {
				want = append(want, uint64(i))
			}
		}
		w := openTestWAL(t, dir, WALConfig{})
		defer w.Close()
		if got := replayed(t, w); !reflect.DeepEqual(got, want) {
			t.Fatalf("replayed %v, want the untouched records %v", got, want)
		}
	})
}
