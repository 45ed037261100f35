package ferry

import (
	"hash/maphash"
	"sync/atomic"
)

// topicTable maps topic names to their state for Send's lookup: an
// open-addressing hash table read with atomic loads and no lock. Writers
// (serialized by the broker's lock) add, replace or remove one entry in
// place; the table is copied only when it grows (doubling, so creating
// a topic is O(1) amortized) or when removed entries pile up.
//
// A lookup reads one slot line (a hash and a pointer), then the state
// whose hash matches: two cache misses over 10,000 cold topics, where
// sync.Map's trie walks a node per level.
type topicTable struct {
	cur  atomic.Pointer[topicSlots]
	seed maphash.Seed
	live int // entries; guarded by the writers' lock
	dead int // removed entries' slots (tombstones); guarded too
}

// topicSlots is one generation of the table.
type topicSlots struct {
	mask  uint64
	slots []topicSlot
}

// topicSlot is a name's slot: h is written once, before t is first
// stored, and never changes, so a reader that loads a non-nil t may read
// h. A removed entry leaves removedTopic in t.
type topicSlot struct {
	h uint64
	t atomic.Pointer[topicState]
}

// removedTopic marks a removed entry's slot (a tombstone): lookups probe
// past it, and it is dropped when the table is copied.
var removedTopic = new(topicState)

const minTopicSlots = 16

func newTopicTable() *topicTable {
	return &topicTable{seed: maphash.MakeSeed()}
}

// lookup returns the named topic's state.
func (tt *topicTable) lookup(name string) (*topicState, bool) {
	s := tt.cur.Load()
	if s == nil {
		return nil, false
	}
	_, t := s.find(maphash.String(tt.seed, name), name)
	return t, t != nil
}

// find returns the slot holding the topic name, of hash h, and the state
// it held when read; nil, nil if s holds no such topic.
func (s *topicSlots) find(h uint64, name string) (*topicSlot, *topicState) {
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		sl := &s.slots[i]
		t := sl.t.Load()
		if t == nil {
			return nil, nil
		}
		if t != removedTopic && sl.h == h && t.meta.Name == name {
			return sl, t
		}
	}
}

// store adds t, or replaces the state of its name. The caller holds the
// writers' lock.
func (tt *topicTable) store(t *topicState) {
	name := t.meta.Name
	h := maphash.String(tt.seed, name)
	s := tt.cur.Load()
	if s != nil {
		if sl, _ := s.find(h, name); sl != nil {
			sl.t.Store(t)
			return
		}
	}
	if s == nil || 2*(tt.live+tt.dead+1) > len(s.slots) {
		s = tt.grow(s)
	}
	tt.insert(s, h, t)
	tt.live++
}

// insert puts t, of hash h, into s's first free slot.
func (tt *topicTable) insert(s *topicSlots, h uint64, t *topicState) {
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		sl := &s.slots[i]
		if sl.t.Load() == nil {
			sl.h = h
			sl.t.Store(t)
			return
		}
	}
}

// grow publishes a copy of s without its tombstones, with room for
// twice the live entries (at least).
func (tt *topicTable) grow(s *topicSlots) *topicSlots {
	size := minTopicSlots
	for size < 4*(tt.live+1) {
		size *= 2
	}
	ns := &topicSlots{mask: uint64(size - 1), slots: make([]topicSlot, size)}
	if s != nil {
		for i := range s.slots {
			if t := s.slots[i].t.Load(); t != nil && t != removedTopic {
				tt.insert(ns, s.slots[i].h, t)
			}
		}
	}
	tt.dead = 0
	tt.cur.Store(ns)
	return ns
}

// remove removes the named topic. The caller holds the writers' lock.
func (tt *topicTable) remove(name string) {
	s := tt.cur.Load()
	if s == nil {
		return
	}
	if sl, _ := s.find(maphash.String(tt.seed, name), name); sl != nil {
		sl.t.Store(removedTopic)
		tt.live--
		tt.dead++
	}
}

// each calls f for every topic in the table.
func (tt *topicTable) each(f func(t *topicState)) {
	s := tt.cur.Load()
	if s == nil {
		return
	}
	for i := range s.slots {
		if t := s.slots[i].t.Load(); t != nil && t != removedTopic {
			f(t)
		}
	}
}
