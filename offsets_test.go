package ferry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// offsetsStorage is a memory storage whose queues have OffsetsContext,
// as a distributed storage's do: it counts the calls, and while blocking
// is set each waits for its ctx.
type offsetsStorage struct {
	*ferry.MemoryStorage
	calls    atomic.Int64
	blocking atomic.Bool
}

func (s *offsetsStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	return &offsetsQueue{Queue: q, s: s}, nil
}

type offsetsQueue struct {
	ferry.Queue
	s *offsetsStorage
}

var _ ferry.OffsetsContexter = (*offsetsQueue)(nil)

func (q *offsetsQueue) OffsetsContext(ctx context.Context) (oldest, next int64, err error) {
	q.s.calls.Add(1)
	if q.s.blocking.Load() {
		<-ctx.Done()
		return 0, 0, ctx.Err()
	}
	oldest, next = q.Offsets()
	return oldest, next, nil
}

// Where a queue has OffsetsContext, the consumer's take and Lag use it,
// under their ctx: a Lag whose queue does not answer ends with its ctx.
func TestOffsetsContexterIsUsed(t *testing.T) {
	ctx := t.Context()
	st := &offsetsStorage{MemoryStorage: ferry.NewMemoryStorage()}
	t.Cleanup(func() { _ = st.Close() })
	b := newTopic(t, 2, ferry.WithStorage(st))
	produce(t, b, "t", "m", 10, 4)
	tl := newTally(10)
	startConsumer(t, b, "g", tl.handler())
	tl.waitAll(t)
	taken := st.calls.Load()
	assert.GreaterOrEqual(t, taken, int64(2), "each queue's take asked for its offsets")

	require.Eventually(t, func() bool {
		gl, err := b.Lag(ctx, "g", "t")
		return err == nil && gl.Lag == 0
	}, time.Minute, time.Millisecond, "Lag through OffsetsContext")
	assert.Greater(t, st.calls.Load(), taken, "Lag asked the queues")

	st.blocking.Store(true)
	lctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := b.Lag(lctx, "g", "t")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's ctx ends a Lag whose queue does not answer")
	st.blocking.Store(false)
}
