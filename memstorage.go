package ferry

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
)

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
	if err := q.SetDedupWindow(meta.DedupWindow); err != nil {
		return nil, &Error{Op: "open queue", Err: err} // Validate let it through: cannot happen
	}
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
		if !have.Matches(meta) {
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
