package tokenin

import (
	"container/list"
	"sync"
)

// Store keeps the last token-in call of each (rollout, attempt), bounded by
// MaxEntries and MaxBytes: past either, the least recently used attempts
// are evicted (OnEvict counts them) and their next call is rendered whole
// (First). Safe for concurrent use.
type Store struct {
	mu         sync.Mutex
	maxEntries int
	maxBytes   int64
	bytes      int64
	ll         *list.List // front: most recently used
	m          map[string]*list.Element
	onEvict    func()
}

type entry struct {
	key  string
	prev *Prev
	size int64
}

// NewStore makes a store of at most maxEntries attempts and maxBytes
// (estimated) bytes; onEvict, when not nil, is called once per eviction.
func NewStore(maxEntries int, maxBytes int64, onEvict func()) *Store {
	return &Store{maxEntries: max(maxEntries, 1), maxBytes: max(maxBytes, 1), ll: list.New(), m: map[string]*list.Element{}, onEvict: onEvict}
}

// Key is the store's key of a (rollout, attempt).
func Key(rollout, attempt string) string { return rollout + "\x00" + attempt }

// Get returns the attempt's previous call, or nil.
func (s *Store) Get(key string) *Prev {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return nil
	}
	s.ll.MoveToFront(e)
	return e.Value.(*entry).prev
}

// Put records the attempt's latest call (p is not modified afterwards). An
// entry larger than the whole budget is not kept (and counted as evicted).
func (s *Store) Put(key string, p *Prev) {
	size := p.size() + int64(len(key))
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[key]; ok {
		old := e.Value.(*entry)
		s.bytes -= old.size
		s.ll.Remove(e)
		delete(s.m, key)
	}
	if size > s.maxBytes {
		s.evicted()
		return
	}
	s.m[key] = s.ll.PushFront(&entry{key: key, prev: p, size: size})
	s.bytes += size
	for s.ll.Len() > s.maxEntries || s.bytes > s.maxBytes {
		e := s.ll.Back()
		old := e.Value.(*entry)
		s.ll.Remove(e)
		delete(s.m, old.key)
		s.bytes -= old.size
		s.evicted()
	}
}

func (s *Store) evicted() {
	if s.onEvict != nil {
		s.onEvict()
	}
}

// Len and Bytes are the entries held and their estimated size.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ll.Len()
}

// Bytes is the estimated size of the entries held.
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}
