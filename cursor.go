package ferry

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// Cursor is one consumer group's progress on a topic: per queue, the next
// offset to consume (Kafka's convention: a committed offset is never the
// last one consumed). -1 means nothing was committed for that queue.
type Cursor struct {
	Group   string
	Offsets []int64
}

// Cursors is the progress of every group on one topic.
type Cursors struct {
	Topic  string
	Groups map[string]Cursor
}

// CursorStore is where cursors persist.
//
// Implementations must be safe for concurrent use. After Close every method
// but Close returns [ErrClosed]; Close is idempotent.
type CursorStore interface {
	// Load returns one next-offset per queue (queues of them) of topic for
	// group; -1 where nothing was committed. An invalid topic name or a
	// negative queue count is [ErrInvalidTopic]. The caller owns the slice.
	Load(ctx context.Context, topic, group string, queues int) ([]int64, error)
	// Commit records offset as the next offset group consumes from queue of
	// topic. A later Commit for the same queue replaces it, even with a
	// lower offset (a reset). A negative queue or offset is an error.
	Commit(ctx context.Context, topic, group string, queue int, offset int64) error
	io.Closer
}

// MemoryCursorStore is the in-memory [CursorStore], the default.
// It is safe for concurrent use.
type MemoryCursorStore struct {
	mu      sync.Mutex // guards offsets and closed
	offsets map[cursorKey]int64
	closed  bool
}

type cursorKey struct {
	topic, group string
	queue        int
}

var _ CursorStore = (*MemoryCursorStore)(nil)

// NewMemoryCursorStore returns an empty store.
func NewMemoryCursorStore() *MemoryCursorStore {
	return &MemoryCursorStore{offsets: map[cursorKey]int64{}}
}

// ValidateCursorArgs checks the arguments CursorStore implementations share:
// a valid topic name, a group name of 1 to 255 bytes and a queue count or
// index in range. Errors wrap [ErrInvalidTopic] or [ErrInvalidOption].
func ValidateCursorArgs(topic, group string, queue int) error {
	if err := ValidateTopicName(topic); err != nil {
		return err
	}
	if group == "" || len(group) > 255 {
		return fmt.Errorf("%w: group name of %d bytes", ErrInvalidOption, len(group))
	}
	if queue < 0 || queue > MaxQueues {
		return fmt.Errorf("%w: queue %d out of range", ErrInvalidTopic, queue)
	}
	return nil
}

// Load implements [CursorStore].
func (s *MemoryCursorStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := ValidateCursorArgs(topic, group, queues); err != nil {
		return nil, fmt.Errorf("ferry: load cursor: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ferry: load cursor: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("ferry: load cursor: %w", ErrClosed)
	}
	out := make([]int64, queues)
	for i := range out {
		off, ok := s.offsets[cursorKey{topic, group, i}]
		if !ok {
			off = -1
		}
		out[i] = off
	}
	return out, nil
}

// Commit implements [CursorStore].
func (s *MemoryCursorStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := ValidateCursorArgs(topic, group, queue); err != nil {
		return fmt.Errorf("ferry: commit cursor: %w", err)
	}
	if offset < 0 {
		return fmt.Errorf("ferry: commit cursor: %w: offset %d", ErrOffsetOutOfRange, offset)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ferry: commit cursor: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("ferry: commit cursor: %w", ErrClosed)
	}
	s.offsets[cursorKey{topic, group, queue}] = offset
	return nil
}

// Close implements [io.Closer]. Idempotent.
func (s *MemoryCursorStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
