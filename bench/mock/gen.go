package mock

import "math"

// Deterministic hashing and pseudo-random numbers: FNV-1a for hashing request content,
// splitmix64 for sequences. Nothing here depends on time or global state.

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

type hasher uint64

func newHasher() hasher { return fnvOffset }

func (h *hasher) str(s string) {
	v := uint64(*h)
	for i := 0; i < len(s); i++ {
		v ^= uint64(s[i])
		v *= fnvPrime
	}
	v ^= 0xff // field separator
	v *= fnvPrime
	*h = hasher(v)
}

func (h *hasher) u64(x uint64) {
	v := uint64(*h)
	for i := 0; i < 8; i++ {
		v ^= x & 0xff
		v *= fnvPrime
		x >>= 8
	}
	*h = hasher(v)
}

func (h *hasher) ids(ids []uint32) {
	v := uint64(*h)
	for _, id := range ids {
		for k := 0; k < 4; k++ {
			v ^= uint64(id & 0xff)
			v *= fnvPrime
			id >>= 8
		}
	}
	v ^= 0xfe
	v *= fnvPrime
	*h = hasher(v)
}

func (h hasher) sum() uint64 { return mix64(uint64(h)) }

// mix64 is the splitmix64 finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// rng is splitmix64.
type rng uint64

func (r *rng) next() uint64 {
	*r += 0x9e3779b97f4a7c15
	return mix64(uint64(*r))
}

// genTextIDs appends k generated word ids for the sequence seeded by seed.
// The sequence does not depend on k, so a shorter output is a prefix of a longer one.
func genTextIDs(dst []uint32, seed uint64, k int) []uint32 {
	r := rng(seed)
	for j := 0; j < k; j++ {
		dst = append(dst, genWords[r.next()%uint64(len(genWords))])
	}
	return dst
}

// logprobMilli returns the logprob (in thousandths) of the rank-th candidate at position pos
// of the sequence seeded by seed; rank 0 is the sampled token, later ranks are lower.
func logprobMilli(seed uint64, pos, rank int) int64 {
	h := mix64(seed ^ (uint64(pos)+1)*0x9e3779b97f4a7c15)
	lp := -int64(1 + h%2000)
	if rank > 0 {
		lp -= int64(rank)*250 + int64(rank)*int64((h>>16)%50)
	}
	return lp
}

func logprob(seed uint64, pos, rank int) float64 {
	return float64(logprobMilli(seed, pos, rank)) / 1000
}

// altToken returns the rank-th (rank >= 1) alternative to token id in top-logprob lists;
// alternatives are distinct from id and from each other for rank < len(genWords).
func altToken(id uint32, rank int) uint32 {
	g := uint32(len(genWords))
	base := id % g
	if id >= genBase && id < genBase+g {
		base = id - genBase
	} else {
		rank-- // id is not a word, so rank 1 may use the base word itself
	}
	return genWords[(base+uint32(rank))%g]
}

// embedding fills v with a deterministic unit vector for seed.
func embedding(v []float32, seed uint64) {
	r := rng(seed)
	var norm float64
	f := make64(len(v))
	for i := range f {
		x := float64(int64(r.next()%2001)-1000) / 1000
		f[i] = x
		norm += x * x
	}
	norm = math.Sqrt(norm)
	if norm == 0 {
		norm = 1
	}
	for i := range v {
		v[i] = float32(f[i] / norm)
	}
}

func make64(n int) []float64 {
	if n <= 16 {
		var a [16]float64
		return a[:n]
	}
	return make([]float64, n)
}
