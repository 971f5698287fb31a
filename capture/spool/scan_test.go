package spool

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// corruptFile applies edits to the file at path: each 3 bytes of edits are
// a position (uint16, modulo the size) and a byte xored there; a last odd
// byte, when not zero, cuts the file by that many bytes. It returns the
// positions changed and the new size.
func corruptFile(t *testing.T, path string, edits []byte) (changed []int64, size int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	orig := slices.Clone(b)
	for len(edits) >= 3 {
		pos := int(binary.LittleEndian.Uint16(edits)) % len(b)
		b[pos] ^= edits[2]
		edits = edits[3:]
	}
	for i := range b {
		if b[i] != orig[i] {
			changed = append(changed, int64(i))
		}
	}
	if len(edits) > 0 && int(edits[0]) < len(b) {
		b = b[:len(b)-int(edits[0])]
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return changed, int64(len(b))
}

// untouched reports whether no changed position lies in [off, end) and the
// range is within size.
func untouched(changed []int64, off, end, size int64) bool {
	if end > size {
		return false
	}
	for _, c := range changed {
		if c >= off && c < end {
			return false
		}
	}
	return true
}

// FuzzSpoolRecovery: whatever bytes of a valid segment are flipped or cut,
// opening the spool never panics, and every record the damage did not touch
// is replayed, in order; nothing else is (a damaged record is set aside).
func FuzzSpoolRecovery(f *testing.F) {
	one := len(AppendRecord(nil, batch(0)))
	f.Add([]byte{byte(magicLen + 20), 0, 1})                            // a payload byte of the first record
	f.Add([]byte{byte(int(magicLen) + one + 1), 0, 0x40})               // the second record's length
	f.Add([]byte{2, 0, 'X'})                                            // the magic
	f.Add([]byte{byte(int(magicLen) + 2*one + 5), 0, 0xff, 1, 0, 1, 9}) // a CRC, the magic, a torn tail
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, edits []byte) {
		dir := t.TempDir()
		d, err := openDir(dir, 1<<20, func(int) {}, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		var offs []int64
		off := magicLen
		for i := range 5 {
			rec := AppendRecord(nil, batch(i))
			if err := d.append(rec, false); err != nil {
				t.Fatal(err)
			}
			offs = append(offs, off)
			off += int64(len(rec))
		}
		path := d.segPath(d.segs[0].id)
		if err := d.close(); err != nil {
			t.Fatal(err)
		}
		changed, size := corruptFile(t, path, edits)
		var want []int
		for i, o := range offs {
			if untouched(changed, o, o+int64(one), size) {
				want = append(want, i)
			}
		}

		d, err = openDir(dir, 1<<20, func(int) {}, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		defer d.close()
		var got []int
		for d.records > 0 {
			pos := d.head()
			b, n, err := d.read(pos)
			if err != nil {
				t.Fatalf("read at %+v: %v", pos, err)
			}
			got = append(got, int(b.Calls[0].SequenceID/2))
			pos.n = n
			if err := d.ack(pos); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("replayed batches %v, want the untouched ones %v (changed bytes at %v, size %d)", got, want, changed, size)
		}
		if q, _ := filepath.Glob(filepath.Join(dir, "*.quarantine")); len(want) < 5 && len(q) == 0 {
			t.Fatalf("damage but no quarantine file")
		}
	})
}
