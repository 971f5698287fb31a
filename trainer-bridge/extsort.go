package bridge

import (
	"bufio"
	"container/heap"
	"io"
	"slices"
)

// sortRun is how many records a sorter holds in memory: more are written,
// sorted, as runs to a file and merged when read (a variable for tests).
var sortRun = defaultSortRun

const defaultSortRun = 1 << 14

// noteHeld, when set (tests), is told the most records of a kind that a
// Build held in memory at once: "sort" (a sorter's buffer), "group" (the
// members of one advantage group), "rollout" (the attempts of one rollout
// in the selection).
var noteHeld func(kind string, n int)

func held(kind string, n int) {
	if noteHeld != nil {
		noteHeld(kind, n)
	}
}

// sorter orders records of type T by cmp with bounded memory: at most
// sortRun records in memory, the rest in sorted runs on disk, merged by
// each (which may be called again to read them once more).
type sorter[T any] struct {
	dir, what string
	cmp       func(a, b *T) int
	enc       func(e *recordEncoder, x *T)
	dec       func(d *spillDecoder) T
	buf       []T
	file      *recordFile
	runs      []int64 // where each run ends in file
	sorted    bool
	rec       recordEncoder
}

func newSorter[T any](dir, what string, cmp func(a, b *T) int, enc func(e *recordEncoder, x *T), dec func(d *spillDecoder) T) *sorter[T] {
	return &sorter[T]{dir: dir, what: what, cmp: cmp, enc: enc, dec: dec}
}

// add appends x.
func (s *sorter[T]) add(x T) error {
	if len(s.buf) >= sortRun {
		if err := s.writeRun(); err != nil {
			return err
		}
	}
	s.buf = append(s.buf, x)
	s.sorted = false
	return nil
}

// writeRun writes the buffer, sorted, as a run.
func (s *sorter[T]) writeRun() error {
	held("sort", len(s.buf))
	if s.file == nil {
		f, err := newRecordFile(s.dir, s.what, 64<<10)
		if err != nil {
			return err
		}
		s.file = f
	}
	slices.SortStableFunc(s.buf, func(a, b T) int { return s.cmp(&a, &b) })
	for i := range s.buf {
		s.rec = s.rec[:0]
		s.enc(&s.rec, &s.buf[i])
		if err := s.file.append(s.rec); err != nil {
			return err
		}
	}
	s.runs = append(s.runs, s.file.off)
	clear(s.buf)
	s.buf = s.buf[:0]
	return nil
}

// each calls f with every record in order; f must not keep x.
func (s *sorter[T]) each(f func(x *T) error) error {
	if s.file == nil {
		held("sort", len(s.buf))
		if !s.sorted {
			slices.SortStableFunc(s.buf, func(a, b T) int { return s.cmp(&a, &b) })
			s.sorted = true
		}
		for i := range s.buf {
			if err := f(&s.buf[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if len(s.buf) > 0 {
		if err := s.writeRun(); err != nil {
			return err
		}
	}
	if err := s.file.w.Flush(); err != nil {
		return s.file.writeErr(err)
	}
	m := &merge[T]{cmp: s.cmp}
	start := int64(0)
	for _, end := range s.runs {
		c := &runCursor[T]{r: bufio.NewReaderSize(io.NewSectionReader(s.file.f, start, end-start), 16<<10), max: end - start}
		start = end
		ok, err := c.advance(s)
		if err != nil {
			return err
		}
		if ok {
			m.cs = append(m.cs, c)
		}
	}
	heap.Init(m)
	for len(m.cs) > 0 {
		c := m.cs[0]
		if err := f(&c.x); err != nil {
			return err
		}
		ok, err := c.advance(s)
		if err != nil {
			return err
		}
		if ok {
			heap.Fix(m, 0)
		} else {
			heap.Pop(m)
		}
	}
	return nil
}

// close removes the runs' file.
func (s *sorter[T]) close() {
	if s.file != nil {
		s.file.close()
	}
}

// runCursor is the next record of one run.
type runCursor[T any] struct {
	r   *bufio.Reader
	buf []byte
	max int64
	x   T
}

func (c *runCursor[T]) advance(s *sorter[T]) (bool, error) {
	rec, buf, err := readRecord(c.r, c.buf, c.max)
	c.buf = buf
	if err == io.EOF {
		return false, nil
	}
	if err != nil {
		return false, s.file.readErr(err)
	}
	d := spillDecoder{b: rec}
	c.x = s.dec(&d)
	if d.bad || len(d.b) != 0 {
		return false, s.file.readErr(errSpillCorrupt)
	}
	return true, nil
}

// merge is a min-heap of run cursors.
type merge[T any] struct {
	cs  []*runCursor[T]
	cmp func(a, b *T) int
}

func (m *merge[T]) Len() int           { return len(m.cs) }
func (m *merge[T]) Less(i, j int) bool { return m.cmp(&m.cs[i].x, &m.cs[j].x) < 0 }
func (m *merge[T]) Swap(i, j int)      { m.cs[i], m.cs[j] = m.cs[j], m.cs[i] }
func (m *merge[T]) Push(x any)         { m.cs = append(m.cs, x.(*runCursor[T])) }
func (m *merge[T]) Pop() any {
	c := m.cs[len(m.cs)-1]
	m.cs = m.cs[:len(m.cs)-1]
	return c
}
