package ferrytest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// FakeStorage is a [ferry.Storage] for tests: it keeps topic metadata in
// memory and hands out [FakeQueue]s, which a test can get back with
// [FakeStorage.Queue] to inject faults into or inspect. Its own fault
// methods apply to every queue it opens and count write calls across all
// of them, which is how a test makes the second of several writes fail.
// Like [ferry.MemoryStorage], opening a queue that is open returns the
// same queue, opening one that was closed gives a new, empty one, and
// Close closes every queue.
//
// A FakeStorage is safe for concurrent use.
type FakeStorage struct {
	faults faults

	mu     sync.Mutex // guards every field below
	topics map[string]ferry.TopicMeta
	queues map[ferry.QueueID]*FakeQueue
	calls  []WriteCall
	closed bool
}

var _ ferry.Storage = (*FakeStorage)(nil)

// NewFakeStorage returns an empty fake storage.
func NewFakeStorage() *FakeStorage {
	return &FakeStorage{topics: map[string]ferry.TopicMeta{}, queues: map[ferry.QueueID]*FakeQueue{}}
}

// FailNth makes the nth write call across every queue of the storage
// (counting from 1, failed ones included) fail with err, storing nothing.
func (s *FakeStorage) FailNth(n int, err error) { s.faults.failOn(n, err) }

// FailNthOf makes the nth write call to queues of topic (counting from 1,
// failed ones included) fail with err, storing nothing: unlike
// [FakeStorage.FailNth], writes to other topics (a dead-letter topic, say)
// do not count.
func (s *FakeStorage) FailNthOf(topic string, n int, err error) { s.faults.failTopicOn(topic, n, err) }

// FailWrites makes every later write to any queue of the storage fail with
// err, storing nothing, until FailWrites(nil).
func (s *FakeStorage) FailWrites(err error) { s.faults.set(func(f *faults) { f.failAll = err }) }

// DelayNth makes the nth write call across every queue wait d before going
// on; if its context ends first, it fails with the context's error.
func (s *FakeStorage) DelayNth(n int, d time.Duration) { s.faults.delayOn(n, d) }

// OnWrite sets a hook called before every write to any queue of the
// storage, after the queue's own faults (nil removes it); call counts
// across queues.
func (s *FakeStorage) OnWrite(h WriteHook) { s.faults.set(func(f *faults) { f.onWrite = h }) }

// OnRead sets a hook called before every read of any queue of the storage,
// after the queue's own hook (nil removes it); call counts across queues.
func (s *FakeStorage) OnRead(h ReadHook) { s.faults.set(func(f *faults) { f.onRead = h }) }

// Queue returns the queue last opened as number i of topic, or nil if none
// was.
func (s *FakeStorage) Queue(topic string, i int) *FakeQueue {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queues[ferry.QueueID{Topic: topic, Queue: i}]
}

// Writes returns every write call to the storage's queues, failed ones
// included, in the order they returned. The caller owns the slices.
func (s *FakeStorage) Writes() []WriteCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneCalls(s.calls)
}

// Messages returns every message written to topic so far, by queue then
// offset.
func (s *FakeStorage) Messages(topic string) []*ferry.EnhancedMessage {
	var calls []WriteCall
	for _, c := range s.Writes() {
		if c.Queue.Topic == topic {
			calls = append(calls, c)
		}
	}
	return messagesOf(calls)
}

func (s *FakeStorage) record(c WriteCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

// OpenQueue implements [ferry.Storage].
func (s *FakeStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, queue int) (ferry.Queue, error) {
	if err := checkContext(ctx); err != nil {
		return nil, fmt.Errorf("ferrytest: open queue: %w", err)
	}
	if err := meta.Validate(); err != nil {
		return nil, &ferry.Error{Op: "ferrytest: open queue", Err: err}
	}
	if queue < 0 || queue >= meta.Queues {
		return nil, &ferry.Error{Op: "ferrytest: open queue", Err: fmt.Errorf("%w: queue %d of %d in topic %q", ferry.ErrInvalidTopic, queue, meta.Queues, meta.Name)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &ferry.Error{Op: "ferrytest: open queue", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &ferry.Error{Op: "ferrytest: open queue", Err: ferry.ErrClosed}
	}
	id := ferry.QueueID{Topic: meta.Name, Queue: queue}
	if q, ok := s.queues[id]; ok && !q.isClosed.Load() {
		return q, nil
	}
	q := NewFakeQueue(id, meta.Retention)
	q.shared, q.record = &s.faults, s.record
	s.queues[id] = q
	return q, nil
}

// Topics implements [ferry.Storage].
func (s *FakeStorage) Topics(ctx context.Context) ([]ferry.TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return nil, fmt.Errorf("ferrytest: topics: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &ferry.Error{Op: "ferrytest: topics", Err: ferry.ErrClosed}
	}
	out := make([]ferry.TopicMeta, 0, len(s.topics))
	for _, m := range s.topics {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b ferry.TopicMeta) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// SaveTopic implements [ferry.Storage].
func (s *FakeStorage) SaveTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return fmt.Errorf("ferrytest: save topic: %w", err)
	}
	if err := meta.Validate(); err != nil {
		return &ferry.Error{Op: "ferrytest: save topic", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &ferry.Error{Op: "ferrytest: save topic", Err: ferry.ErrClosed}
	}
	s.topics[meta.Name] = meta.Normalized()
	return nil
}

// Close implements [io.Closer]: it closes every queue. It is idempotent;
// the records stay.
func (s *FakeStorage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, q := range s.queues {
		_ = q.Close()
	}
	return nil
}
