// Package dedup is the deduplication window of one queue, shared by the
// memory queue and filestore: which [ferry.Message] dedup keys the queue
// stored, where, and when, for as long as the topic's window.
//
// A Window is not safe for concurrent use: the queue's write lock guards
// it. A write looks each key up and adds the ones it stores at once (so
// that a key twice in one batch is stored once), then keeps the write, or
// rolls the window back to the mark it took if the write does not happen.
package dedup

import "time"

// Entry is where the first message with a key went.
type Entry struct {
	Offset int64
	ID     [16]byte
	Stored int64 // store time, Unix ns
}

// Window remembers the keys stored within the last window of time.
// Memory is one map entry and one list item per key stored within the
// window: Expire drops the older ones.
type Window struct {
	window int64 // ns, > 0
	keys   map[string]Entry
	fifo   []item // in the order added: about store time order
	head   int    // fifo[head:] are live
}

type item struct {
	key    string
	offset int64
	stored int64
}

// New returns a window of d, or nil (no deduplication) when d <= 0.
func New(d time.Duration) *Window {
	if d <= 0 {
		return nil
	}
	return &Window{window: int64(d), keys: make(map[string]Entry)}
}

// Duration returns the window's length.
func (w *Window) Duration() time.Duration { return time.Duration(w.window) }

// SetDuration changes the window's length (d > 0); entries older than
// the new window go at the next Expire.
func (w *Window) SetDuration(d time.Duration) { w.window = int64(d) }

// Lookup returns the entry of key if it was stored less than the window
// before now.
func (w *Window) Lookup(key string, now int64) (Entry, bool) {
	e, ok := w.keys[key]
	if !ok || now-e.Stored >= w.window {
		return Entry{}, false
	}
	return e, true
}

// Mark returns a point Rollback returns to.
func (w *Window) Mark() int { return len(w.fifo) }

// Add records that key was stored as e.
func (w *Window) Add(key string, e Entry) {
	w.keys[key] = e
	w.fifo = append(w.fifo, item{key: key, offset: e.Offset, stored: e.Stored})
}

// Rollback forgets what was added since mark.
func (w *Window) Rollback(mark int) {
	for i := len(w.fifo) - 1; i >= mark && i >= w.head; i-- {
		it := w.fifo[i]
		if e, ok := w.keys[it.key]; ok && e.Offset == it.offset {
			delete(w.keys, it.key)
		}
		w.fifo[i] = item{}
	}
	w.fifo = w.fifo[:max(mark, w.head)]
}

// Expire drops the entries stored a window or more before now.
func (w *Window) Expire(now int64) {
	for w.head < len(w.fifo) && now-w.fifo[w.head].stored >= w.window {
		it := w.fifo[w.head]
		if e, ok := w.keys[it.key]; ok && e.Offset == it.offset {
			delete(w.keys, it.key)
		}
		w.fifo[w.head] = item{}
		w.head++
	}
	switch {
	case w.head == len(w.fifo):
		w.fifo, w.head = w.fifo[:0], 0
	case w.head >= 1024 && w.head >= len(w.fifo)/2:
		n := copy(w.fifo, w.fifo[w.head:])
		clear(w.fifo[n:])
		w.fifo, w.head = w.fifo[:n], 0
	}
	if len(w.keys) == 0 && len(w.fifo) == 0 && cap(w.fifo) > 1024 {
		// A burst is over: give its memory back (a map never shrinks).
		w.keys, w.fifo = make(map[string]Entry), nil
	}
}

// Len returns the number of keys remembered.
func (w *Window) Len() int { return len(w.keys) }
