// Package dedup is the deduplication window of one queue, shared by the
// memory queue and filestore: which [ferry.Message] dedup keys the queue
// stored, where, and when, for as long as the topic's window.
//
// A Window is not safe for concurrent use: the queue's write lock guards
// it. A write looks each key up and adds the ones it stores at once (so
// that a key twice in one batch is stored once), then keeps the write, or
// rolls the window back to the mark it took if the write does not happen.
//
// A window holds 128-bit hashes of the keys, not the keys: its entries
// hold no pointers, so the garbage collector never scans them (a window
// of millions of keys cost a Send four times its time when it held the
// strings), and each takes an 8-byte slot in a table at most three
// quarters full and a 48-byte entry, whatever the key's length. Two
// different keys share a hash with a probability below 2^-64 even for
// 2^32 keys in one window.
package dedup

import (
	"hash/maphash"
	"math"
	"time"
)

// Hash is a key as a window holds it.
type Hash [16]byte

// seeds make the two halves of a Hash independent 64-bit hashes. They
// are random per process: a window is rebuilt from the keys themselves.
var seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// HashKey returns the Hash of key.
func HashKey(key string) Hash {
	var h Hash
	a, b := maphash.String(seeds[0], key), maphash.String(seeds[1], key)
	for i := range 8 {
		h[i], h[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	return h
}

// Entry is where the first message with a key went.
type Entry struct {
	Offset int64
	ID     [16]byte
	Stored int64 // store time, Unix ns
}

// Window remembers the keys stored within the last window of time, in
// two generations of a window's length each: new keys go into cur, and a
// lookup reads cur, then prev. Expire drops prev once every key in it is
// a window old, all at once, and cur then becomes prev. So a key costs a
// write one probe to add and none to expire (no list of what expires, no
// delete per key), and memory is at most two windows' keys.
type Window struct {
	window int64 // ns, > 0
	cur    table
	prev   table
	// curMin and curMax bound the store times of cur's keys (valid while
	// cur holds any), prevMax those of prev's.
	curMin, curMax, prevMax int64
	// added lists the keys Put added since Mark, for Rollback.
	added []added
	warm  uint64 // the sum of Warm's reads
}

type added struct {
	key    Hash
	offset int64
}

// New returns a window of d, or nil (no deduplication) when d <= 0.
func New(d time.Duration) *Window {
	if d <= 0 {
		return nil
	}
	return &Window{window: int64(d)}
}

// Duration returns the window's length.
func (w *Window) Duration() time.Duration { return time.Duration(w.window) }

// SetDuration changes the window's length (d > 0); entries older than
// the new window go at the next Expire.
func (w *Window) SetDuration(d time.Duration) { w.window = int64(d) }

// Lookup returns the entry of key if it was stored less than the window
// before now.
func (w *Window) Lookup(key Hash, now int64) (Entry, bool) {
	since := now - w.window
	if e, ok := w.cur.get(key); ok {
		// A key in cur and prev is newer in cur, which only takes it
		// again once prev's is stale.
		return e, e.Stored > since
	}
	if e, ok := w.prev.get(key); ok && e.Stored > since {
		return e, true
	}
	return Entry{}, false
}

// Put is Lookup, then Add of key as e when Lookup finds nothing (one
// probe of cur where the two take two): it returns the entry of key
// stored less than the window before now and true, or adds e. Rollback
// takes back what Put adds.
func (w *Window) Put(key Hash, e Entry, now int64) (Entry, bool) {
	since := now - w.window
	w.cur.reserve()
	i, ok := w.cur.find(key)
	if ok {
		s := w.cur.entry(i)
		if s.e.Stored > since {
			return s.e, true
		}
		s.e = e // a stale entry; prev's, if any, is older still
	} else {
		if old, ok := w.prev.get(key); ok && old.Stored > since {
			return old, true
		}
		w.cur.insertAt(i, key, e)
	}
	w.stored(e.Stored)
	w.added = append(w.added, added{key: key, offset: e.Offset})
	return Entry{}, false
}

// Warm prepares the Puts of keys, a batch's: it grows cur for them all
// first, then reads each key's home slot in both tables, each read
// independent of the others, so that the processor fetches their cache
// lines together instead of one Put's miss after the other's. In a window
// larger than the caches that miss is most of what a new key costs.
func (w *Window) Warm(keys []Hash) {
	w.cur.reserveN(len(keys))
	var sum uint64
	for _, k := range keys {
		sum += w.cur.home(k)
	}
	if w.prev.live > 0 {
		for _, k := range keys {
			sum += w.prev.home(k)
		}
	}
	w.warm = sum // kept, so that the reads are not dropped as unused
}

// Keys is a write's scratch: the hashes of its keys, taken together by
// HashAll and handed out in order by Next.
type Keys struct {
	hs   []Hash
	next int
}

// HashAll hashes the keys of msgs, a write's, in order (key returns ""
// for a message without one) and has w warm them (see Warm), when there
// are several: their Puts then take them from k.Next.
func HashAll[M any](k *Keys, w *Window, msgs []M, key func(M) string) {
	k.hs, k.next = k.hs[:0], 0
	if len(msgs) < 2 {
		return // one Put: nothing to overlap its miss with
	}
	for _, m := range msgs {
		if s := key(m); s != "" {
			k.hs = append(k.hs, HashKey(s))
		}
	}
	w.Warm(k.hs)
}

// Next returns the Hash of key, the next keyed message's of the write
// HashAll took (hashing it there and then if it took none).
func (k *Keys) Next(key string) Hash {
	if k.next < len(k.hs) {
		k.next++
		return k.hs[k.next-1]
	}
	return HashKey(key)
}

// Mark starts a write: it returns the point Rollback returns to.
func (w *Window) Mark() int {
	w.added = w.added[:0]
	return 0
}

// Add records that key was stored as e (a window rebuilt from what a
// queue stored, in store order). Rollback does not take it back.
func (w *Window) Add(key Hash, e Entry) {
	w.cur.put(key, e, math.MaxInt64)
	w.stored(e.Stored)
}

// stored accounts for a key of store time t just added to cur.
func (w *Window) stored(t int64) {
	if w.cur.len() == 1 {
		w.curMin, w.curMax = t, t
		return
	}
	w.curMin, w.curMax = min(w.curMin, t), max(w.curMax, t)
}

// Rollback forgets what Put added since mark (from Mark, in the same
// write).
func (w *Window) Rollback(mark int) {
	for i := len(w.added) - 1; i >= mark; i-- {
		a := w.added[i]
		if !w.cur.delete(a.key, a.offset) {
			w.prev.delete(a.key, a.offset)
		}
	}
	w.added = w.added[:min(mark, len(w.added))]
}

// Expire drops the keys stored a window or more before now, a
// generation at a time.
func (w *Window) Expire(now int64) {
	if w.prev.len() > 0 && now-w.prevMax >= w.window {
		w.prev.reset()
	}
	if w.prev.len() == 0 && w.cur.len() > 0 && now-w.curMin >= w.window {
		w.cur, w.prev = w.prev, w.cur // cur takes prev's emptied slots
		w.prevMax = w.curMax
		if now-w.prevMax >= w.window {
			w.prev.reset()
		}
	}
}

// Len returns the number of keys remembered: those stored within the
// window, and some older ones of a generation not dropped yet.
func (w *Window) Len() int { return w.cur.len() + w.prev.len() }
