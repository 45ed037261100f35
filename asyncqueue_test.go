package ferry_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

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
	began  atomic.Int64  // WriteAsync calls
	hold   chan struct{} // if not nil, each write waits for a value
}

type asyncWrite struct {
	ctx  context.Context
	msgs []*ferry.EnhancedMessage
	done func(int64, error)
}

var _ ferry.AsyncWriter = (*asyncQueue)(nil)

func newAsyncQueue(id ferry.QueueID, r ferry.Retention, hold chan struct{}) *asyncQueue {
	q := &asyncQueue{MemoryQueue: ferry.NewMemoryQueue(id, r), ch: make(chan asyncWrite, 8), hold: hold}
	q.wg.Go(func() {
		for w := range q.ch {
			if q.hold != nil {
				<-q.hold
			}
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
	hold   chan struct{} // passed to the queues
	mu     sync.Mutex
	queues []*asyncQueue
}

func (s *asyncStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	if _, err := s.MemoryStorage.OpenQueue(ctx, meta, i); err != nil {
		return nil, err
	}
	q := newAsyncQueue(ferry.QueueID{Topic: meta.Name, Queue: i}, meta.Retention, s.hold)
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
		return newAsyncQueue(ferry.QueueID{Topic: meta.Name, Queue: i}, meta.Retention, nil)
	})
}

// Over an AsyncWriter, a send whose ctx ends while its write waits is
// reported with ctx's error and not written (or, when it shares its
// write with sends whose ctx goes on, written), in order with the sends
// around it; the queue holds what was reported written, in send order;
// Close flushes.
func TestSendAsyncCancelAsyncWriter(t *testing.T) {
	hold := make(chan struct{})
	as := &asyncStorage{MemoryStorage: ferry.NewMemoryStorage(), hold: hold}
	t.Cleanup(func() { _ = as.Close() })
	b := ferrytest.NewBroker(t, ferry.WithStorage(as))
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
	p := newProducer(t, b, ferry.WithMaxInFlight(100))
	var a acks
	for i := range 10 {
		ctx := t.Context()
		var end context.CancelFunc = func() {}
		if i%3 == 1 { // SendAsync refuses a ctx done already: end it after the call
			ctx, end = context.WithCancel(ctx)
		}
		require.NoError(t, p.SendAsync(ctx, &ferry.Message{Topic: "orders", Body: []byte(strconv.Itoa(i))}, a.done(i)))
		end()
	}
	close(hold) // every held write goes on
	require.NoError(t, p.Close())
	got := a.all()
	require.Len(t, got, 10)
	var stored []string
	for i, g := range got {
		require.Equal(t, i, g.seq, "reported in send order")
		if g.err != nil {
			require.ErrorIs(t, g.err, context.Canceled, "send %d", i)
			require.Equal(t, 1, i%3, "send %d failed", i)
			continue
		}
		stored = append(stored, strconv.Itoa(i))
	}
	rq, err := b.Queue("orders", 0)
	require.NoError(t, err)
	_, next := rq.Offsets()
	dst := make([]*ferry.EnhancedMessage, next)
	n, err := rq.Read(t.Context(), 0, dst)
	require.NoError(t, err)
	var bodies []string
	for _, m := range dst[:n] {
		bodies = append(bodies, string(m.Body))
	}
	require.Equal(t, stored, bodies)
	require.GreaterOrEqual(t, len(stored), 6, "the sends whose ctx did not end")
}
