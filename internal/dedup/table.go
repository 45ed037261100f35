package dedup

import "encoding/binary"

// table is a window's keys: an open-addressing hash table with linear
// probing over the Hashes themselves. They are uniform already, so a
// key's first 8 bytes are its home slot (no hashing again, as a map of
// [16]byte would), and a lookup that adds a missing key, or a delete,
// takes one probe sequence where a map takes two. A probe reads control
// bytes (64 to a cache line), one per slot: empty, or 7 more bits of the
// key's hash; it reads a slot only when those match, so a missing key,
// what most writes look up, costs about one cache line of them. A delete
// moves the keys after it back into its place where their home slots
// allow (no tombstones), so a window that churns keeps its runs short
// and never rehashes in place: the table only grows, or empties.
type table struct {
	ctrl  []uint8 // per slot: empty, or full|bits of the key
	slots []slot  // len a power of two, or 0
	live  int     // full slots
}

type slot struct {
	key Hash
	e   Entry
}

const (
	empty uint8 = 0
	full  uint8 = 0x80 // | 7 bits of the key's second half
)

// tag returns key's control byte.
func tag(key Hash) uint8 { return full | key[8]&0x7f }

// minSlots is the smallest table, and the size an emptied one goes back to.
const minSlots = 64

func (t *table) len() int { return t.live }

// home returns key's first slot.
func (t *table) home(key Hash) uint64 {
	return binary.LittleEndian.Uint64(key[:8]) & uint64(len(t.slots)-1)
}

// find returns the slot of key and true, or false and the empty slot
// that ended the search (where an insert of key goes). The table must
// not be empty.
func (t *table) find(key Hash) (uint64, bool) {
	mask := uint64(len(t.slots) - 1)
	want := tag(key)
	for i := t.home(key); ; i = (i + 1) & mask {
		switch t.ctrl[i] {
		case empty:
			return i, false
		case want:
			if t.slots[i].key == key {
				return i, true
			}
		}
	}
}

// get returns key's entry.
func (t *table) get(key Hash) (Entry, bool) {
	if t.live == 0 {
		return Entry{}, false
	}
	i, ok := t.find(key)
	if !ok {
		return Entry{}, false
	}
	return t.slots[i].e, true
}

// put sets key's entry, unless the one there was stored after since:
// then it returns that one and true.
func (t *table) put(key Hash, e Entry, since int64) (Entry, bool) {
	if (t.live+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	i, ok := t.find(key)
	s := &t.slots[i]
	if ok {
		if s.e.Stored > since {
			return s.e, true
		}
		s.e = e
		return Entry{}, false
	}
	t.ctrl[i] = tag(key)
	*s = slot{key: key, e: e}
	t.live++
	return Entry{}, false
}

// delete removes key if its entry's offset is offset.
func (t *table) delete(key Hash, offset int64) {
	if t.live == 0 {
		return
	}
	i, ok := t.find(key)
	if !ok || t.slots[i].e.Offset != offset {
		return
	}
	t.live--
	if t.live == 0 && len(t.slots) > minSlots {
		*t = table{} // a burst is over: give its memory back
		return
	}
	// Backward shift: each later key of the run whose home slot is not
	// cyclically between the hole and it moves into the hole, which
	// moves to where it was, until the run ends.
	mask := uint64(len(t.slots) - 1)
	for j := (i + 1) & mask; t.ctrl[j] != empty; j = (j + 1) & mask {
		if h := t.home(t.slots[j].key); (j-h)&mask >= (j-i)&mask {
			t.ctrl[i], t.slots[i] = t.ctrl[j], t.slots[j]
			i = j
		}
	}
	t.ctrl[i], t.slots[i] = empty, slot{}
}

// grow doubles the slots (to minSlots from none).
func (t *table) grow() {
	n := max(minSlots, 2*len(t.slots))
	oldCtrl, old := t.ctrl, t.slots
	t.ctrl, t.slots = make([]uint8, n), make([]slot, n)
	for i, c := range oldCtrl {
		if c != empty {
			j, _ := t.find(old[i].key)
			t.ctrl[j], t.slots[j] = c, old[i]
		}
	}
}
