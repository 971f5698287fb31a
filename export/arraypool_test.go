package export

import (
	"math"
	"testing"
)

// TestArrayPool: a released lease's blocks go back to the pool (poisoned
// when asked), a read takes the smallest that fits, else the largest; a
// nil lease hands out nothing; a second release gives nothing back twice.
func TestArrayPool(t *testing.T) {
	var none *ArrayLease
	none.KeepUint32s(make([]uint32, 3))
	none.Release()
	if none.Uint32s(1) != nil || none.Float32s(1) != nil {
		t.Fatal("a nil lease handed out memory")
	}
	p := &ArrayPool{Poison: true}
	l := p.Lease()
	if l.Uint32s(1) != nil {
		t.Fatal("an empty pool handed out memory")
	}
	small, big := []uint32{1, 2}, []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	l.KeepUint32s(small)
	l.KeepUint32s(big)
	l.KeepUint32s(nil) // no memory: not kept
	l.KeepFloat32s([]float32{0.5})
	l.Release()
	l.Release()
	if len(p.u32) != 2 || len(p.f32) != 1 {
		t.Fatalf("pooled %d and %d blocks", len(p.u32), len(p.f32))
	}
	if big[0] != math.MaxUint32 || small[1] != math.MaxUint32 {
		t.Fatal("released blocks not poisoned")
	}
	l = p.Lease()
	if b := l.Uint32s(3); cap(b) != 8 || len(b) != 0 {
		t.Fatalf("want 3: block of capacity %d, length %d", cap(b), len(b))
	}
	if b := l.Uint32s(100); cap(b) != 2 {
		t.Fatalf("want 100: block of capacity %d", cap(b))
	}
	if l.Uint32s(1) != nil {
		t.Fatal("a block handed out twice")
	}
	if f := l.Float32s(1); cap(f) != 1 || !math.IsNaN(float64(f[:1][0])) {
		t.Fatalf("float block %v", f[:cap(f)])
	}
}
