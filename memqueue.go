package ferry

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MemoryQueue is the in-memory [Queue], the default. It keeps message
// pointers in a slice, hands readers the stored pointers (no copy per
// reader or group), wakes blocked readers through per-reader channels (no
// polling) and enforces its [Retention]: with [DropOldest] the oldest
// messages go when a bound is exceeded; with [Block] a write waits until
// [MemoryQueue.Release] lets older messages go. Age is enforced whenever the
// queue is used; no goroutine runs in the background.
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
}

var (
	_ Queue      = (*MemoryQueue)(nil)
	_ TryWriter  = (*MemoryQueue)(nil)
	_ Releaser   = (*MemoryQueue)(nil)
	_ readParker = (*MemoryQueue)(nil)
)

// NewMemoryQueue returns an empty queue with the given identity and
// retention (zero fields take their defaults, see [Retention]).
func NewMemoryQueue(id QueueID, r Retention) *MemoryQueue {
	r = TopicMeta{Retention: r}.Normalized().Retention
	return &MemoryQueue{id: id, ret: r}
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
	var size int64
	for i, m := range msgs {
		if m == nil {
			return 0, &Error{Op: fmt.Sprintf("write %s: message %d", q.id, i), Err: fmt.Errorf("%w: nil", ErrInvalidMessage)}
		}
		size += int64(m.Size())
	}
	if err := ctx.Err(); err != nil {
		return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: err}
	}
	n := int64(len(msgs))
	if over(n, q.ret.MaxMessages) || over(size, q.ret.MaxBytes) {
		return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: fmt.Errorf("%w: batch of %d messages, %d bytes exceeds retention", ErrMessageTooLarge, n, size)}
	}
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: ErrClosed}
		}
		if now.IsZero() {
			now = stampTime() // one clock read per write: it costs as much as the rest of a small write
		}
		q.trim(now, n, size)
		if q.ret.Overflow == DropOldest || q.fits(n, size) {
			break
		}
		if !wait {
			q.mu.Unlock()
			return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: ErrQueueFull}
		}
		if q.space == nil {
			q.space = make(chan struct{})
		}
		space := q.space
		q.mu.Unlock()
		now = time.Time{} // stored after the wait: read the clock again
		select {
		case <-space:
		case <-ctx.Done():
			return 0, &Error{Op: fmt.Sprintf("write %s", q.id), Err: ctx.Err()}
		}
		q.mu.Lock()
	}
	first := q.base + int64(len(q.msgs)-q.head)
	if n == 0 {
		q.mu.Unlock()
		return first, nil
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
	q.trim(now, 0, 0)
	q.wakeReaders()
	q.mu.Unlock()
	return first, nil
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

// MemoryStorage is the in-memory [Storage], the default. It keeps topic
// metadata in a map and hands out [MemoryQueue]s: opening a queue that is
// open returns the same queue; opening one that was closed gives a new,
// empty queue (memory is not persistent). Close closes every queue.
//
// A MemoryStorage is safe for concurrent use.
type MemoryStorage struct {
	mu     sync.Mutex // guards every field below
	topics map[string]TopicMeta
	queues map[QueueID]*MemoryQueue
	closed bool
}

var (
	_ Storage       = (*MemoryStorage)(nil)
	_ SharedStorage = (*MemoryStorage)(nil)
)

// NewMemoryStorage returns an empty storage.
func NewMemoryStorage() *MemoryStorage {
	return &MemoryStorage{topics: map[string]TopicMeta{}, queues: map[QueueID]*MemoryQueue{}}
}

// OpenQueue implements [Storage].
func (s *MemoryStorage) OpenQueue(ctx context.Context, meta TopicMeta, queue int) (Queue, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "open queue", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return nil, &Error{Op: "open queue", Err: err}
	}
	if queue < 0 || queue >= meta.Queues {
		return nil, &Error{Op: "open queue", Err: fmt.Errorf("%w: queue %d of %d in topic %q", ErrInvalidTopic, queue, meta.Queues, meta.Name)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "open queue", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &Error{Op: "open queue", Err: ErrClosed}
	}
	id := QueueID{Topic: meta.Name, Queue: queue}
	if q, ok := s.queues[id]; ok {
		q.mu.Lock()
		closed := q.closed
		q.mu.Unlock()
		if !closed {
			return q, nil
		}
	}
	q := NewMemoryQueue(id, meta.Retention)
	s.queues[id] = q
	return q, nil
}

// Topics implements [Storage].
func (s *MemoryStorage) Topics(ctx context.Context) ([]TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "topics", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &Error{Op: "topics", Err: ErrClosed}
	}
	out := make([]TopicMeta, 0, len(s.topics))
	for _, m := range s.topics {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b TopicMeta) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// SaveTopic implements [Storage].
func (s *MemoryStorage) SaveTopic(ctx context.Context, meta TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "save topic", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return &Error{Op: "save topic", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "save topic", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "save topic", Err: ErrClosed}
	}
	s.topics[meta.Name] = meta.Normalized()
	return nil
}

// CreateTopic implements [SharedStorage].
func (s *MemoryStorage) CreateTopic(ctx context.Context, meta TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "create topic", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return &Error{Op: "create topic", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "create topic", Err: err}
	}
	meta = meta.Normalized()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "create topic", Err: ErrClosed}
	}
	if have, ok := s.topics[meta.Name]; ok {
		if have != meta {
			return &Error{Op: fmt.Sprintf("create topic %q", meta.Name), Err: fmt.Errorf("%w: have %+v, asked %+v", ErrTopicExists, have, meta)}
		}
		return nil
	}
	s.topics[meta.Name] = meta
	return nil
}

// DeleteTopic implements [TopicDeleter].
func (s *MemoryStorage) DeleteTopic(ctx context.Context, name string) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "delete topic", Err: err}
	}
	if err := ValidateTopicName(name); err != nil {
		return &Error{Op: "delete topic", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "delete topic", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "delete topic", Err: ErrClosed}
	}
	delete(s.topics, name)
	for id, q := range s.queues {
		if id.Topic == name {
			_ = q.Close()
			delete(s.queues, id)
		}
	}
	return nil
}

var _ TopicDeleter = (*MemoryStorage)(nil)

// Topic implements [SharedStorage].
func (s *MemoryStorage) Topic(ctx context.Context, name string) (TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return TopicMeta{}, &Error{Op: "topic", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return TopicMeta{}, &Error{Op: "topic", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return TopicMeta{}, &Error{Op: "topic", Err: ErrClosed}
	}
	meta, ok := s.topics[name]
	if !ok {
		return TopicMeta{}, &topicNotFound{name: name}
	}
	return meta, nil
}

// Close implements [io.Closer]: it closes every open queue. Idempotent.
func (s *MemoryStorage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, q := range s.queues {
		_ = q.Close()
	}
	s.queues = nil
	return nil
}
