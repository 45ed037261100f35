package dedup

import "encoding/binary"

// table is a window's keys: an open-addressing hash table with linear
// probing over the Hashes themselves, whose entries live apart, in the
// order added.
//
// A slot is 8 bytes: 32 bits of the key's hash (its first 8 bytes'
// upper half), which are also its home slot, and the index of its entry.
// So a table of a window's keys is small for the caches (8 bytes a slot
// at most three quarters full, where a slot holding the key and its
// entry takes 48), a probe compares a slot without reading the entry
// (it reads the entry, to compare the whole key, only when the 32 bits
// match), and the entries are appended in sequence: a write that adds a
// missing key, what most writes do, touches one slot at random and the
// end of the entries. The Hashes are uniform already, so they are not
// hashed again, as a map of [16]byte would. A lookup that adds a missing
// key takes one probe sequence where a map takes two.
//
// A delete (only a rolled-back write deletes) moves the keys after it
// back into its place where their home slots allow (no tombstones): a
// rolled-back write leaves no trace in the slots. The table only grows,
// or empties at once.
type table struct {
	slots []uint64 // len a power of two, or 0; 0 empty, else fp<<32 | entry index+1
	// ents holds the entries by index, in chunks of chunkLen: they are
	// appended without copying those before. Those no slot names are
	// garbage until reset.
	ents [][]slot
	n    int // entries in ents
	live int // full slots
}

// chunkLen is the entries of a chunk (48 KiB).
const chunkLen = 1024

type slot struct {
	key Hash
	e   Entry
}

// fp returns the 32 bits of key a slot holds, and its home slot in a
// table of up to 2^32 slots.
func fp(key Hash) uint64 { return uint64(binary.LittleEndian.Uint32(key[4:8])) }

// minSlots is the smallest table, and the size an emptied one goes back to.
const minSlots = 64

func (t *table) len() int { return t.live }

// find returns the slot of key and true, or false and the empty slot
// that ended the search (where an insert of key goes). The table must
// not be empty.
func (t *table) find(key Hash) (uint64, bool) {
	mask := uint64(len(t.slots) - 1)
	f := fp(key)
	for i := f & mask; ; i = (i + 1) & mask {
		v := t.slots[i]
		switch {
		case v == 0:
			return i, false
		case v>>32 == f && t.ent(uint32(v)-1).key == key:
			return i, true
		}
	}
}

// entry returns the entry of full slot i.
func (t *table) entry(i uint64) *slot { return t.ent(uint32(t.slots[i]) - 1) }

// ent returns entry j.
func (t *table) ent(j uint32) *slot { return &t.ents[j/chunkLen][j%chunkLen] }

// get returns key's entry.
func (t *table) get(key Hash) (Entry, bool) {
	if t.live == 0 {
		return Entry{}, false
	}
	i, ok := t.find(key)
	if !ok {
		return Entry{}, false
	}
	return t.entry(i).e, true
}

// put sets key's entry, unless the one there was stored after since:
// then it returns that one and true.
func (t *table) put(key Hash, e Entry, since int64) (Entry, bool) {
	t.reserve()
	i, ok := t.find(key)
	if ok {
		s := t.entry(i)
		if s.e.Stored > since {
			return s.e, true
		}
		s.e = e
		return Entry{}, false
	}
	t.insertAt(i, key, e)
	return Entry{}, false
}

// reserve grows the table if one more key would fill it over three
// quarters: find, then insertAt, may follow.
func (t *table) reserve() {
	if (t.live+1)*4 > len(t.slots)*3 {
		t.grow()
	}
}

// reserveN grows the table so that n more keys keep it at most three
// quarters full: no find until then moves the slots.
func (t *table) reserveN(n int) {
	for (t.live+n)*4 > len(t.slots)*3 {
		t.grow()
	}
}

// home returns the home slot of key, or 0 when the table has no slots.
// Warm reads it only to have its cache line fetched.
func (t *table) home(key Hash) uint64 {
	if len(t.slots) == 0 {
		return 0
	}
	return t.slots[fp(key)&uint64(len(t.slots)-1)]
}

// insertAt puts key, which is not in the table, as e into the empty slot
// i that find returned for it.
func (t *table) insertAt(i uint64, key Hash, e Entry) {
	c := t.n / chunkLen
	if c == len(t.ents) {
		t.ents = append(t.ents, make([]slot, chunkLen))
	}
	t.ents[c][t.n%chunkLen] = slot{key: key, e: e}
	t.n++
	t.slots[i] = fp(key)<<32 | uint64(t.n)
	t.live++
}

// reset empties the table. It keeps its memory for the keys to come
// unless its slots were mostly empty (a burst is over: it gives their
// memory back).
func (t *table) reset() {
	if len(t.slots) > minSlots && t.live*8 < len(t.slots) {
		*t = table{}
		return
	}
	clear(t.slots)
	// The chunks the keys to come take again; no more than the slots'.
	keep := min(len(t.ents), (len(t.slots)*3/4+chunkLen-1)/chunkLen)
	clear(t.ents[keep:])
	t.ents = t.ents[:keep]
	t.n, t.live = 0, 0
}

// delete removes key if its entry's offset is offset, and reports
// whether it did.
func (t *table) delete(key Hash, offset int64) bool {
	if t.live == 0 {
		return false
	}
	i, ok := t.find(key)
	if !ok || t.entry(i).e.Offset != offset {
		return false
	}
	if idx := uint32(t.slots[i]); int(idx) == t.n {
		t.n-- // the last added: a rollback's, usually
	}
	t.live--
	if t.live == 0 {
		t.reset() // a burst is over: give its memory back
		return true
	}
	// Backward shift: each later key of the run whose home slot is not
	// cyclically between the hole and it moves into the hole, which
	// moves to where it was, until the run ends.
	mask := uint64(len(t.slots) - 1)
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		if h := (t.slots[j] >> 32) & mask; (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
	return true
}

// grow doubles the slots (to minSlots from none). A slot holds its home,
// so the entries are not read.
func (t *table) grow() {
	n := max(minSlots, 2*len(t.slots))
	old := t.slots
	t.slots = make([]uint64, n)
	mask := uint64(n - 1)
	for _, v := range old {
		if v != 0 {
			i := (v >> 32) & mask
			for t.slots[i] != 0 {
				i = (i + 1) & mask
			}
			t.slots[i] = v
		}
	}
}
