package dedup

import "encoding/binary"

// table is a window's keys: an open-addressing hash table with linear
// probing over the Hashes themselves. They are uniform already, so a
// key's first 8 bytes are its home slot (no hashing again, as a map of
// [16]byte would), and a lookup that adds a missing key, or a delete,
// takes one probe sequence where a map takes two. A probe reads control
// bytes (64 to a cache line), one per slot: empty, gone (a tombstone,
// until the next rehash) or 7 more bits of the key's hash; it reads a
// slot only when those match, so a missing key, what most writes look
// up, costs about one cache line of them however long its run is.
type table struct {
	ctrl  []uint8 // per slot: empty, gone, or full|bits of the key
	slots []slot  // len a power of two, or 0
	live  int     // full slots
	used  int     // full and tombstone slots
}

type slot struct {
	key Hash
	e   Entry
}

const (
	empty uint8 = 0
	gone  uint8 = 1
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

// find returns the slot of key and true, or false and the slot an
// insert of key takes (the first tombstone on its way, else the empty
// slot that ended it). The table must not be empty.
func (t *table) find(key Hash) (int, bool) {
	mask := uint64(len(t.slots) - 1)
	want := tag(key)
	free := -1
	for i := t.home(key); ; i = (i + 1) & mask {
		switch c := t.ctrl[i]; c {
		case empty:
			if free < 0 {
				free = int(i)
			}
			return free, false
		case gone:
			if free < 0 {
				free = int(i)
			}
		case want:
			if t.slots[i].key == key {
				return int(i), true
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
	if (t.used+1)*4 > len(t.slots)*3 {
		t.rehash()
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
	if t.ctrl[i] == empty {
		t.used++
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
	t.ctrl[i], t.slots[i] = gone, slot{}
	t.live--
	if t.live == 0 && len(t.slots) > minSlots {
		*t = table{} // a burst is over: give its memory back
	}
}

// rehash makes room: twice the slots when more than half are live, the
// same number (without tombstones) otherwise.
func (t *table) rehash() {
	n := max(minSlots, len(t.slots))
	if t.live*2 >= n {
		n *= 2
	}
	oldCtrl, old := t.ctrl, t.slots
	t.ctrl, t.slots, t.live, t.used = make([]uint8, n), make([]slot, n), 0, 0
	for i, c := range oldCtrl {
		if c&full != 0 {
			j, _ := t.find(old[i].key)
			t.ctrl[j], t.slots[j] = c, old[i]
			t.live++
			t.used++
		}
	}
}
