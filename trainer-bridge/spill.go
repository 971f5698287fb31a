package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// spill keeps the samples a streamed Build assembled in its one pass over
// the store, on disk, until the batch-wide advantages are known: memory then
// stays flat however large the export, and the store is read once (reading
// it again cost half the throughput, and a rollout could change in between).
// The file is private to one Build and removed by close; its format is
// internal (little-endian, length-prefixed), written and read in order.
type spill struct {
	*recordFile
	buf []byte
	// The previous sample's prompt and response, written and read: the
	// next prompt is stored as the prefix it shares with them and the rest.
	wprev, rprev []uint32
	rstr         [7]string // the previous sample's strings, read
}

// newSpill creates the spill file in dir (os.TempDir when empty).
func newSpill(dir string) (*spill, error) {
	f, err := newRecordFile(dir, "sample spill", 1<<20)
	if err != nil {
		return nil, err
	}
	return &spill{recordFile: f}, nil
}

func (s *spill) putUvarint(v uint64) { s.buf = binary.AppendUvarint(s.buf, v) }

func (s *spill) putString(v string) {
	s.putUvarint(uint64(len(v)))
	s.buf = append(s.buf, v...)
}

// write appends one sample.
func (s *spill) write(x *Sample) error {
	s.buf = s.buf[:0]
	for _, v := range []string{x.RolloutID, x.AttemptID, x.TaskID, x.AgentName, x.PolicyVersion, x.GroupUID, x.TokenSource} {
		s.putString(v)
	}
	var flags uint64
	for i, b := range []bool{x.Trimmed, x.Truncated, x.HasLogprobs, x.MixedPolicy} {
		if b {
			flags |= 1 << i
		}
	}
	s.putUvarint(flags)
	s.putUvarint(uint64(x.ChoiceIndex))
	s.buf = binary.LittleEndian.AppendUint64(s.buf, math.Float64bits(x.Reward))
	s.buf = binary.LittleEndian.AppendUint64(s.buf, math.Float64bits(x.Advantage))
	s.putUvarint(uint64(len(x.SequenceIDs)))
	for _, v := range x.SequenceIDs {
		s.putUvarint(v)
	}
	// The prompt as the length of its prefix shared with the previous
	// sample's prompt and response, then the rest: an agent's next turn
	// starts with its previous turn, so most of a prompt is written once.
	shared := sharedPrefix(x.Prompt, s.wprev)
	s.putUvarint(uint64(shared))
	for _, ids := range [][]uint32{x.Prompt[shared:], x.Response} {
		s.putUvarint(uint64(len(ids)))
		s.buf = appendU32s(s.buf, ids, func(v uint32) uint32 { return v })
	}
	s.wprev = append(append(s.wprev[:0], x.Prompt...), x.Response...)
	s.putUvarint(uint64(len(x.ResponseMask)))
	s.buf = append(s.buf, x.ResponseMask...)
	s.putUvarint(uint64(len(x.Logprobs)))
	s.buf = appendU32s(s.buf, x.Logprobs, math.Float32bits)
	return s.append(s.buf)
}

// sharedPrefix is the length of the prefix p and prev share. The usual
// cases, p extending prev (an agent's next turn) or p a prefix of prev
// (the same prompt again), are compared as whole runs of memory.
func sharedPrefix(p, prev []uint32) int {
	n := min(len(p), len(prev))
	if slices.Equal(p[:n], prev[:n]) {
		return n
	}
	i := 0
	for i < n && p[i] == prev[i] {
		i++
	}
	return i
}

// appendU32s appends the 32 bits bits gives of each of vs, little-endian.
func appendU32s[T uint32 | float32](b []byte, vs []T, bits func(T) uint32) []byte {
	at := len(b)
	b = slices.Grow(b, 4*len(vs))[:at+4*len(vs)]
	out := b[at:]
	for i, v := range vs {
		binary.LittleEndian.PutUint32(out[4*i:4*i+4], bits(v))
	}
	return b
}

// rewind ends writing and starts reading from the first sample.
func (s *spill) rewind() error {
	s.rprev, s.rstr = s.rprev[:0], [7]string{}
	return s.recordFile.rewind()
}

// errSpillCorrupt means the spill did not read back as written.
var errSpillCorrupt = errors.New("bridge: the sample spill does not read back as written (the temporary folder changed under the export?)")

// read returns the next sample.
func (s *spill) read() (*Sample, error) {
	b, err := s.next()
	if err == io.EOF {
		return nil, fmt.Errorf("bridge: reading the sample spill: %w", io.ErrUnexpectedEOF)
	}
	if err != nil {
		return nil, err
	}
	d := spillDecoder{b: b}
	x := &Sample{}
	// A field equal to the previous sample's shares its string: the
	// samples of a rollout repeat them.
	for i, v := range []*string{&x.RolloutID, &x.AttemptID, &x.TaskID, &x.AgentName, &x.PolicyVersion, &x.GroupUID, &x.TokenSource} {
		if b := d.bytes(d.count(1)); string(b) == s.rstr[i] {
			*v = s.rstr[i]
		} else {
			*v = string(b)
			s.rstr[i] = *v
		}
	}
	flags := d.uvarint()
	x.Trimmed, x.Truncated, x.HasLogprobs, x.MixedPolicy = flags&1 != 0, flags&2 != 0, flags&4 != 0, flags&8 != 0
	x.ChoiceIndex = uint32(d.uvarint())
	x.Reward = math.Float64frombits(d.u64())
	x.Advantage = math.Float64frombits(d.u64())
	x.SequenceIDs = make([]uint64, d.count(1))
	for i := range x.SequenceIDs {
		x.SequenceIDs[i] = d.uvarint()
	}
	shared := d.uvarint()
	if shared > uint64(len(s.rprev)) {
		return nil, errSpillCorrupt
	}
	rest := d.count(4)
	p := int(shared) + rest
	restIDs := d.bytes(4 * rest)
	r := d.count(4)
	// Prompt and response in one allocation, each with its capacity cut
	// at its end.
	ids := make([]uint32, p+r)
	x.Prompt, x.Response = ids[:p:p], ids[p:]
	copy(x.Prompt, s.rprev[:shared])
	for i := range rest {
		x.Prompt[int(shared)+i] = binary.LittleEndian.Uint32(restIDs[4*i:])
	}
	respIDs := d.bytes(4 * r)
	for i := range x.Response {
		x.Response[i] = binary.LittleEndian.Uint32(respIDs[4*i : 4*i+4])
	}
	mask := d.bytes(d.count(1))
	x.ResponseMask = make([]uint8, len(mask))
	copy(x.ResponseMask, mask)
	lp := d.bytes(4 * d.count(4))
	x.Logprobs = make([]float32, len(lp)/4)
	for i := range x.Logprobs {
		x.Logprobs[i] = math.Float32frombits(binary.LittleEndian.Uint32(lp[4*i : 4*i+4]))
	}
	if d.bad || len(d.b) != 0 {
		return nil, errSpillCorrupt
	}
	s.rprev = append(append(s.rprev[:0], x.Prompt...), x.Response...)
	return x, nil
}

// spillDecoder reads the fields of one spilled sample; a short or malformed
// record sets bad (and yields zeros) instead of panicking.
type spillDecoder struct {
	b   []byte
	bad bool
}

func (d *spillDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length of items of size bytes each, bounded by what is left.
func (d *spillDecoder) count(size int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/size) {
		d.bad, d.b = true, nil
		return 0
	}
	return int(n)
}

func (d *spillDecoder) bytes(n int) []byte {
	if n > len(d.b) {
		d.bad, d.b = true, nil
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *spillDecoder) string() string { return string(d.bytes(d.count(1))) }

func (d *spillDecoder) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *spillDecoder) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// spillReader decodes a spill's samples in a goroutine of its own, a batch
// ahead of the caller of sample.
type spillReader struct {
	batches chan spillBatch
	done    chan struct{}
	exited  chan struct{}
	cur     spillBatch
}

type spillBatch struct {
	samples []*Sample
	err     error
}

// readAhead starts decoding the next n samples of the rewound spill. Call
// stop when done with it (before close).
func (s *spill) readAhead(n int) *spillReader {
	const batch = 64
	r := &spillReader{batches: make(chan spillBatch, 4), done: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(r.exited)
		defer close(r.batches)
		for n > 0 {
			b := spillBatch{samples: make([]*Sample, 0, min(n, batch))}
			for len(b.samples) < cap(b.samples) && b.err == nil {
				var x *Sample
				if x, b.err = s.read(); b.err == nil {
					b.samples = append(b.samples, x)
				}
			}
			n -= len(b.samples)
			select {
			case r.batches <- b:
			case <-r.done:
				return
			}
			if b.err != nil {
				return
			}
		}
	}()
	return r
}

// sample returns the next sample, or the error that stopped the decoding.
func (r *spillReader) sample() (*Sample, error) {
	for len(r.cur.samples) == 0 {
		if r.cur.err != nil {
			return nil, r.cur.err
		}
		b, ok := <-r.batches
		if !ok {
			return nil, fmt.Errorf("bridge: reading the sample spill: %w", io.ErrUnexpectedEOF)
		}
		r.cur = b
	}
	x := r.cur.samples[0]
	r.cur.samples = r.cur.samples[1:]
	return x, nil
}

// stop ends the decoding and waits for its goroutine.
func (r *spillReader) stop() {
	close(r.done)
	<-r.exited
}
