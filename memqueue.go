package ferry

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry/internal/dedup"
)

// MemoryQueue is the in-memory [Queue], the default. It keeps message
// pointers in a slice, hands readers the stored pointers (no copy per
// reader or group), wakes blocked readers through per-reader channels (no
// polling) and enforces its [Retention]: with [DropOldest] the oldest
// messages go when a bound is exceeded; with [Block] a write waits until
// [MemoryQueue.Release] lets older messages go. Age is enforced whenever the
// queue is used; no goroutine runs in the background. It deduplicates
// writes by [Message.DedupKey] (see [Deduplicator]).
//
// A MemoryQueue is safe for concurrent use.
type MemoryQueue struct {
	id  QueueID
	ret Retention

	mu       sync.Mutex // guards every field below
	msgs     []*EnhancedMessage
	sizes    []int64 // sizes[i] is msgs[i].Size(): trimming reads it, not the (cold) message
	head     int     // msgs[head:] are retained
	base     int64   // offset of msgs[head]
	bytes    int64   // sum of Size over msgs[head:]
	released int64   // Block: offsets below may be dropped
	readers  []chan struct{}
	parked   []*readWaiter // fetch loops parked at the end (see readParker)
	space    chan struct{} // closed when room may have appeared
	closed   bool
	dd       *dedup.Window      // nil: deduplication off
	keep     []*EnhancedMessage // scratch of a deduplicated write: what it stores
	dups     []dupOf            // and what it does not
	keys     dedup.Keys         // and its keys' hashes
	seq      uint64             // its place in the order queues are made: writeAtomic locks queues in it
}

// memQueueSeq numbers the memory queues as they are made.
var memQueueSeq atomic.Uint64

var (
	_ Queue        = (*MemoryQueue)(nil)
	_ TryWriter    = (*MemoryQueue)(nil)
	_ Releaser     = (*MemoryQueue)(nil)
	_ readParker   = (*MemoryQueue)(nil)
	_ Deduplicator = (*MemoryQueue)(nil)
)

// NewMemoryQueue returns an empty queue with the given identity and
// retention (zero fields take their defaults, see [Retention]). It
// deduplicates within [DefaultDedupWindow]; see
// [MemoryQueue.SetDedupWindow].
func NewMemoryQueue(id QueueID, r Retention) *MemoryQueue {
	r = TopicMeta{Retention: r}.Normalized().Retention
	return &MemoryQueue{id: id, ret: r, dd: dedup.New(DefaultDedupWindow), seq: memQueueSeq.Add(1)}
}

// SetDedupWindow sets the queue's deduplication window, as
// [TopicMeta.DedupWindow] does (zero: [DefaultDedupWindow]; [DedupOff]:
// off, forgetting the keys). A value [TopicMeta.Validate] refuses is
// [ErrInvalidOption] and changes nothing.
func (q *MemoryQueue) SetDedupWindow(d time.Duration) error {
	meta := TopicMeta{Name: "t", Queues: 1, DedupWindow: d}
	if err := meta.Validate(); err != nil {
		return &Error{Op: fmt.Sprintf("set dedup window %s", q.id), Err: fmt.Errorf("%w: dedup window %v", ErrInvalidOption, d)}
	}
	d = meta.Normalized().DedupWindow
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case d == DedupOff:
		q.dd = nil
	case q.dd == nil:
		q.dd = dedup.New(d)
	default:
		q.dd.SetDuration(d)
	}
	return nil
}

// DedupWindow implements [Deduplicator].
func (q *MemoryQueue) DedupWindow() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dd == nil {
		return 0
	}
	return q.dd.Duration()
}

// ID implements [Queue].
func (q *MemoryQueue) ID() QueueID { return q.id }

// Write implements [WritableQueue].
func (q *MemoryQueue) Write(ctx context.Context, msgs []*EnhancedMessage) (int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: err}
	}
	return q.write(ctx, msgs, true, time.Time{})
}

// TryWrite implements [TryWriter].
func (q *MemoryQueue) TryWrite(msgs []*EnhancedMessage) (int64, error) {
	return q.write(context.Background(), msgs, false, time.Time{})
}

// write appends msgs, waiting for room if wait. now, when not zero, is the
// caller's clock reading taken just before (a producer's stamp): it serves
// as StoreTime unless the write waits for room, which saves a clock read.
func (q *MemoryQueue) write(ctx context.Context, msgs []*EnhancedMessage, wait bool, now time.Time) (int64, error) {
	size, keyed, err := q.measure(msgs)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: err}
	}
	var a admitted
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: ErrClosed}
		}
		if now.IsZero() {
			now = stampTime() // one clock read per write: it costs as much as the rest of a small write
		}
		var ok bool
		if a, ok = q.admit(msgs, size, keyed, now); ok {
			break
		}
		if !wait {
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: ErrQueueFull}
		}
		space := q.spaceLocked()
		q.mu.Unlock()
		now = time.Time{} // stored after the wait: read the clock again
		select {
		case <-space:
		case <-ctx.Done():
			return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: ctx.Err()}
		}
		q.mu.Lock()
	}
	first := q.appendLocked(a, now)
	q.mu.Unlock()
	return first, nil
}

// measure checks msgs for a write and returns their size, and whether
// any carries a deduplication key.
func (q *MemoryQueue) measure(msgs []*EnhancedMessage) (size int64, keyed bool, err error) {
	for i, m := range msgs {
		if m == nil {
			return 0, false, &Error{Op: fmt.Sprintf("write %s: message %d", q.id, i), Err: fmt.Errorf("%w: nil", ErrInvalidMessage)}
		}
		size += int64(m.Size())
		keyed = keyed || m.DedupKey != ""
	}
	n := int64(len(msgs))
	if over(n, q.ret.MaxMessages) || over(size, q.ret.MaxBytes) {
		return 0, false, &Error{Op: fmt.Sprintf("write %s", q.id), Err: fmt.Errorf("%w: batch of %d messages, %d bytes exceeds retention", ErrMessageTooLarge, n, size)}
	}
	return size, keyed, nil
}

// admitted is what a write admitted to its queue stores: msgs without
// their duplicates, their size, and the window's mark when the write
// added keys to it (-1: none).
type admitted struct {
	msgs []*EnhancedMessage
	size int64
	mark int
}

// admit deduplicates msgs (of size bytes, keyed when one has a key) and
// makes room for the rest: false when they do not fit (the queue keeps
// nothing of them: a write that waits lets others go first). An admitted
// write must be appended (appendLocked) or undone (unadmit) before q.mu
// is released. q.mu must be held, and the queue open.
func (q *MemoryQueue) admit(msgs []*EnhancedMessage, size int64, keyed bool, now time.Time) (admitted, bool) {
	a := admitted{msgs: msgs, size: size, mark: -1}
	if keyed && q.dd != nil {
		a.msgs, a.size, a.mark = q.dedupe(msgs, size, now.UnixNano())
	}
	n := int64(len(a.msgs))
	q.trim(now, n, a.size)
	if q.ret.Overflow == DropOldest || q.fits(n, a.size) {
		return a, true
	}
	q.unadmit(a)
	return a, false
}

// unadmit undoes admit: the keys it added leave the window. q.mu must
// be held.
func (q *MemoryQueue) unadmit(a admitted) {
	if a.mark >= 0 {
		q.dd.Rollback(a.mark)
	}
	clear(q.keep)
	q.keep = q.keep[:0]
}

// spaceLocked returns the channel closed when room may have appeared.
// q.mu must be held.
func (q *MemoryQueue) spaceLocked() chan struct{} {
	if q.space == nil {
		q.space = make(chan struct{})
	}
	return q.space
}

// appendLocked stores what admit admitted, stamped stored at now, and
// returns the offset of the first (where the next would go when all were
// duplicates). q.mu must be held.
func (q *MemoryQueue) appendLocked(a admitted, now time.Time) int64 {
	msgs, size := a.msgs, a.size
	first := q.base + int64(len(q.msgs)-q.head)
	if a.mark >= 0 {
		q.applyDups()
	}
	if len(msgs) == 0 {
		return first
	}
	if q.head > 0 && q.head >= len(q.msgs)/2 && len(q.msgs)+len(msgs) > cap(q.msgs) {
		// Reuse the dropped front instead of growing.
		live := copy(q.msgs, q.msgs[q.head:])
		copy(q.sizes, q.sizes[q.head:])
		clear(q.msgs[live:])
		q.msgs, q.sizes = q.msgs[:live], q.sizes[:live]
		q.head = 0
	}
	stored := now.UnixNano()
	for i, m := range msgs {
		m.Queue = q.id.Queue
		m.Offset = first + int64(i)
		m.StoreUnixNano = stored
		if len(msgs) == 1 {
			q.sizes = append(q.sizes, size) // a Send: its size is known
		} else {
			q.sizes = append(q.sizes, int64(m.Size()))
		}
	}
	q.msgs = append(q.msgs, msgs...)
	q.bytes += size
	if a.mark >= 0 {
		clear(q.keep)
		q.keep = q.keep[:0]
	}
	q.trim(now, 0, 0)
	q.wakeReaders()
	return first
}

// tailLocked returns the queue's messages from offset from on (none
// when from is not retained). q.mu must be held.
func (q *MemoryQueue) tailLocked(from int64) []*EnhancedMessage {
	if from < q.base || q.closed {
		return nil
	}
	i := q.head + int(from-q.base)
	if i >= len(q.msgs) {
		return nil
	}
	return q.msgs[i:]
}

// dedupe returns the messages of msgs (of size bytes) the write stores,
// with their size, and adds their keys to the window (from the mark it
// returns on, to be rolled back if the write does not happen). The
// duplicates, with the entry of the first message of their key (in the
// window, or earlier in msgs), go to q.dups for applyDups. now is the
// write's store time. q.mu must be held.
func (q *MemoryQueue) dedupe(msgs []*EnhancedMessage, size, now int64) ([]*EnhancedMessage, int64, int) {
	q.dd.Expire(now)
	mark := q.dd.Mark()
	next := q.base + int64(len(q.msgs)-q.head)
	// kept is, from the first duplicate on (copied), what the write
	// stores, in q.keep's array: it never aliases msgs, which may then stay
	// on its caller's stack (a Send's batch of one).
	var kept []*EnhancedMessage
	copied := false
	q.dups = q.dups[:0]
	dedup.HashAll(&q.keys, q.dd, msgs, dedupKey)
	for i, m := range msgs {
		if m.DedupKey != "" {
			if e, dup := q.dd.Put(q.keys.Next(m.DedupKey), dedup.Entry{Offset: next, ID: m.ID, Stored: now}, now); dup {
				if !copied {
					kept, copied = append(q.keep[:0], msgs[:i]...), true
				}
				q.dups = append(q.dups, dupOf{m, e})
				size -= int64(m.Size())
				continue
			}
		}
		next++
		if copied {
			kept = append(kept, m)
		}
	}
	if !copied {
		return msgs, size, mark
	}
	q.keep = kept
	return kept, size, mark
}

// dedupKey returns m's DedupKey.
func dedupKey(m *EnhancedMessage) string { return m.DedupKey }

// dupOf is a message a write does not store, and where the first one
// with its key went.
type dupOf struct {
	m *EnhancedMessage
	e dedup.Entry
}

// applyDups reports the duplicates of the write that happens: each gets
// the Queue, Offset, ID and StoreUnixNano of the first message with its
// key. q.mu must be held.
func (q *MemoryQueue) applyDups() {
	for _, d := range q.dups {
		d.m.Queue, d.m.Offset, d.m.ID, d.m.StoreUnixNano = q.id.Queue, d.e.Offset, d.e.ID, d.e.Stored
	}
	clear(q.dups)
	q.dups = q.dups[:0]
}

func over(v, limit int64) bool { return limit != Unlimited && v > limit }

// fits reports whether n more messages of size bytes fit the bounds.
// q.mu must be held.
func (q *MemoryQueue) fits(n, size int64) bool {
	count := int64(len(q.msgs) - q.head)
	return !over(count+n, q.ret.MaxMessages) && !over(q.bytes+size, q.ret.MaxBytes)
}

// trim drops the oldest messages that are over age, and those that keep
// n more messages of size bytes from fitting. With Block overflow only
// released messages go. q.mu must be held.
func (q *MemoryQueue) trim(now time.Time, n, size int64) {
	for q.head < len(q.msgs) {
		if q.ret.MaxAge <= 0 && q.fits(n, size) {
			return // nothing to drop; the oldest message (likely out of cache) stays untouched
		}
		if q.ret.Overflow == Block && q.base >= q.released { // q.base is the oldest's offset
			return
		}
		if q.ret.MaxAge > 0 {
			old := now.UnixNano()-q.msgs[q.head].StoreUnixNano > int64(q.ret.MaxAge)
			if !old && q.fits(n, size) {
				return
			}
		}
		q.msgs[q.head] = nil
		q.bytes -= q.sizes[q.head]
		q.head++
		q.base++
	}
	// Empty: start the slices over.
	q.msgs, q.sizes = q.msgs[:0], q.sizes[:0]
	q.head = 0
}

// wakeReaders wakes every blocked reader and parked fetch loop. q.mu
// must be held.
func (q *MemoryQueue) wakeReaders() {
	for _, ch := range q.readers {
		ch <- struct{}{} // capacity 1, and each reader is listed once
	}
	clear(q.readers)
	q.readers = q.readers[:0]
	for _, w := range q.parked {
		w.listed = false
		w.kicker.kick()
	}
	clear(q.parked)
	q.parked = q.parked[:0]
}

// park implements readParker.
func (q *MemoryQueue) park(offset int64, w *readWaiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || offset != q.base+int64(len(q.msgs)-q.head) {
		q.unparkLocked(w)
		return false // readable, out of range or closed: Read says which
	}
	if !w.listed {
		w.listed = true
		q.parked = append(q.parked, w)
	}
	return true
}

// unpark implements readParker.
func (q *MemoryQueue) unpark(w *readWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.unparkLocked(w)
}

func (q *MemoryQueue) unparkLocked(w *readWaiter) {
	if !w.listed {
		return
	}
	w.listed = false
	if i := slices.Index(q.parked, w); i >= 0 {
		q.parked = slices.Delete(q.parked, i, i+1)
	}
}

// wakeWriters wakes writers waiting for room. q.mu must be held.
func (q *MemoryQueue) wakeWriters() {
	if q.space != nil {
		close(q.space)
		q.space = nil
	}
}

var wakePool = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

// Read implements [ReadableQueue].
func (q *MemoryQueue) Read(ctx context.Context, offset int64, dst []*EnhancedMessage) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &Error{Op: fmt.Sprintf("read %s", q.id), Err: err}
	}
	if len(dst) == 0 {
		return 0, nil
	}
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("read %s", q.id), Err: ErrClosed}
		}
		if q.ret.MaxAge > 0 && q.head < len(q.msgs) {
			q.trim(time.Now(), 0, 0)
		}
		next := q.base + int64(len(q.msgs)-q.head)
		if offset < q.base || offset > next {
			base := q.base
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("read %s at %d", q.id, offset), Err: fmt.Errorf("%w: retained [%d, %d)", ErrOffsetOutOfRange, base, next)}
		}
		if offset < next {
			i := q.head + int(offset-q.base)
			n := copy(dst, q.msgs[i:])
			q.mu.Unlock()
			return n, nil
		}
		if err := ctx.Err(); err != nil {
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("read %s", q.id), Err: err}
		}
		ch := wakePool.Get().(chan struct{})
		q.readers = append(q.readers, ch)
		q.mu.Unlock()
		select {
		case <-ch:
			wakePool.Put(ch)
			q.mu.Lock()
		case <-ctx.Done():
			q.mu.Lock()
			if i := slices.Index(q.readers, ch); i >= 0 {
				q.readers = slices.Delete(q.readers, i, i+1)
			} else {
				<-ch // a writer woke us as ctx ended
			}
			q.mu.Unlock()
			wakePool.Put(ch)
			return 0, &Error{Op: fmt.Sprintf("read %s", q.id), Err: ctx.Err()}
		}
	}
}

// Offsets implements [ReadableQueue].
func (q *MemoryQueue) Offsets() (oldest, next int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed && q.ret.MaxAge > 0 {
		q.trim(time.Now(), 0, 0)
	}
	return q.base, q.base + int64(len(q.msgs)-q.head)
}

// Release implements [Releaser]: with [Block] overflow, messages below
// offset may be dropped to make room. It wakes writers waiting for room.
func (q *MemoryQueue) Release(offset int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.released = max(q.released, offset)
	// Drop what is released at once rather than when room is needed: a
	// memory queue's released messages are garbage the GC would otherwise
	// keep scanning.
	for q.head < len(q.msgs) && q.base < q.released {
		q.msgs[q.head] = nil
		q.bytes -= q.sizes[q.head]
		q.head++
		q.base++
	}
	q.wakeWriters()
}

// Len returns the number of retained messages and their total Size.
func (q *MemoryQueue) Len() (messages int, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs) - q.head, q.bytes
}

// Close implements [io.Closer]: it wakes blocked readers and writers with
// [ErrClosed] and drops the messages. It is idempotent.
func (q *MemoryQueue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	q.base += int64(len(q.msgs) - q.head)
	clear(q.msgs)
	q.msgs, q.sizes, q.head, q.bytes = nil, nil, 0, 0
	q.wakeReaders()
	q.wakeWriters()
	return nil
}
