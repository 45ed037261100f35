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
// strings), and each takes 40 bytes in the list and a 64-byte slot in a
// table at most three quarters full, whatever the key's length. Two
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

// Window remembers the keys stored within the last window of time.
// Memory is one table slot and one list item per key stored within the
// window: Expire drops the older ones.
type Window struct {
	window int64 // ns, > 0
	keys   table
	// fifo lists the keys in the order added (about store time order), in
	// chunks of chunkLen: the list grows and shrinks without copying.
	// fifo[0][head:] and the later chunks' items are live; the last chunk
	// is filled to its length.
	fifo  [][]item
	head  int
	n     int    // live items
	added int    // items ever added, less those rolled back: Mark's count
	spare []item // an emptied chunk, for the next (steady state: one is enough)
}

const chunkLen = 512

type item struct {
	key    Hash
	offset int64
	stored int64
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
	e, ok := w.keys.get(key)
	if !ok || now-e.Stored >= w.window {
		return Entry{}, false
	}
	return e, true
}

// Put is Lookup, then Add of key as e when Lookup finds nothing (one
// probe of the table where the two take two): it returns the entry of
// key stored less than the window before now and true, or adds e.
func (w *Window) Put(key Hash, e Entry, now int64) (Entry, bool) {
	if old, dup := w.keys.put(key, e, now-w.window); dup {
		return old, true
	}
	w.list(key, e)
	return Entry{}, false
}

// Mark returns a point Rollback returns to.
func (w *Window) Mark() int { return w.added }

// Add records that key was stored as e.
func (w *Window) Add(key Hash, e Entry) {
	w.keys.put(key, e, math.MaxInt64)
	w.list(key, e)
}

// list appends key, just stored as e, to the list of what expires.
func (w *Window) list(key Hash, e Entry) {
	if len(w.fifo) == 0 || len(w.fifo[len(w.fifo)-1]) == chunkLen {
		c := w.spare
		if c == nil {
			c = make([]item, 0, chunkLen)
		}
		w.fifo, w.spare = append(w.fifo, c), nil
	}
	last := &w.fifo[len(w.fifo)-1]
	*last = append(*last, item{key: key, offset: e.Offset, stored: e.Stored})
	w.n++
	w.added++
}

// forget deletes the map entry of it unless a later Add replaced it.
func (w *Window) forget(it item) { w.keys.delete(it.key, it.offset) }

// Rollback forgets what was added since mark (and not expired since).
func (w *Window) Rollback(mark int) {
	for ; w.added > mark && w.n > 0; w.added-- {
		last := &w.fifo[len(w.fifo)-1]
		w.forget((*last)[len(*last)-1])
		*last = (*last)[:len(*last)-1]
		w.n--
		if len(*last) == 0 || (len(w.fifo) == 1 && len(*last) == w.head) {
			w.dropChunk(len(w.fifo) - 1)
		}
	}
}

// Expire drops the entries stored a window or more before now.
func (w *Window) Expire(now int64) {
	for w.n > 0 {
		c := w.fifo[0]
		it := c[w.head]
		if now-it.stored < w.window {
			break
		}
		w.forget(it)
		w.head++
		w.n--
		if w.head == len(c) {
			w.dropChunk(0)
		}
	}
}

// dropChunk recycles chunk i, the first or the last.
func (w *Window) dropChunk(i int) {
	w.spare = w.fifo[i][:0]
	w.fifo[i] = nil
	if i == 0 {
		w.fifo = w.fifo[1:]
		w.head = 0
	} else {
		w.fifo = w.fifo[:i]
	}
	if len(w.fifo) == 0 {
		w.fifo, w.head = nil, 0 // the table gives its memory back as it empties
	}
}

// Len returns the number of keys remembered.
func (w *Window) Len() int { return w.keys.len() }
