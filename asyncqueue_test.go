package ferry_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// asyncQueue is a MemoryQueue that is an AsyncWriter, for the producer's
// pipelined path: WriteAsync hands writes to the queue's goroutine, which
// writes them in order and reports each; Close fails those not written.
type asyncQueue struct {
	*ferry.MemoryQueue
	mu     sync.Mutex // guards closed and sends on ch
	closed bool
	ch     chan asyncWrite
	wg     sync.WaitGroup
	began  atomic.Int64 // WriteAsync calls
}

type asyncWrite struct {
	ctx  context.Context
	msgs []*ferry.EnhancedMessage
	done func(int64, error)
}

var _ ferry.AsyncWriter = (*asyncQueue)(nil)

func newAsyncQueue(id ferry.QueueID, r ferry.Retention) *asyncQueue {
	q := &asyncQueue{MemoryQueue: ferry.NewMemoryQueue(id, r), ch: make(chan asyncWrite, 8)}
	q.wg.Go(func() {
		for w := range q.ch {
			w.done(q.MemoryQueue.Write(w.ctx, w.msgs))
		}
	})
	return q
}

func (q *asyncQueue) WriteAsync(ctx context.Context, msgs []*ferry.EnhancedMessage, done func(int64, error)) {
	q.began.Add(1)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		done(0, ferry.ErrClosed)
		return
	}
	q.ch <- asyncWrite{ctx, msgs, done}
}

func (q *asyncQueue) Close() error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
	q.mu.Unlock()
	q.wg.Wait()
	return q.MemoryQueue.Close()
}

// asyncStorage is a MemoryStorage whose queues are asyncQueues.
type asyncStorage struct {
	*ferry.MemoryStorage
	mu     sync.Mutex
	queues []*asyncQueue
}

func (s *asyncStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	if _, err := s.MemoryStorage.OpenQueue(ctx, meta, i); err != nil {
		return nil, err
	}
	q := newAsyncQueue(ferry.QueueID{Topic: meta.Name, Queue: i}, meta.Retention)
	s.mu.Lock()
	s.queues = append(s.queues, q)
	s.mu.Unlock()
	return q, nil
}

func (s *asyncStorage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.queues {
		_ = q.Close()
	}
	return s.MemoryStorage.Close()
}

func (s *asyncStorage) began() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, q := range s.queues {
		n += q.began.Load()
	}
	return n
}

// The test AsyncWriter passes the queue suite's WriteAsync case.
func TestAsyncQueueConformance(t *testing.T) {
	ferrytest.TestQueue(t, ferrytest.Features{}, func(t *testing.T, meta ferry.TopicMeta, i int) ferry.Queue {
		return newAsyncQueue(ferry.QueueID{Topic: meta.Name, Queue: i}, meta.Retention)
	})
}
