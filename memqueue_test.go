package ferry_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func msgs(n, size int) []*ferry.EnhancedMessage {
	out := make([]*ferry.EnhancedMessage, n)
	for i := range out {
		out[i] = &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: make([]byte, size)}}
	}
	return out
}

func TestMemoryQueueDropsOldestByCountAndBytes(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{MaxMessages: 10, MaxBytes: 1000})
	defer q.Close()
	for range 25 {
		_, err := q.Write(ctx, msgs(1, 10))
		require.NoError(t, err)
	}
	oldest, next := q.Offsets()
	assert.Equal(t, int64(15), oldest)
	assert.Equal(t, int64(25), next)
	n, bytes := q.Len()
	assert.Equal(t, 10, n)
	assert.Equal(t, int64(100), bytes)

	_, err := q.Read(ctx, 14, make([]*ferry.EnhancedMessage, 1))
	assert.ErrorIs(t, err, ferry.ErrOffsetOutOfRange, "a reader behind retention")
	dst := make([]*ferry.EnhancedMessage, 100)
	got, err := q.Read(ctx, 15, dst)
	require.NoError(t, err)
	assert.Equal(t, 10, got)
	assert.Equal(t, int64(15), dst[0].Offset)

	// Bytes bound: 400-byte messages, at most 2 fit under 1000.
	for range 3 {
		_, err := q.Write(ctx, msgs(1, 400))
		require.NoError(t, err)
	}
	n, bytes = q.Len()
	assert.Equal(t, 2, n)
	assert.Equal(t, int64(800), bytes)

	_, err = q.Write(ctx, msgs(11, 1))
	assert.ErrorIs(t, err, ferry.ErrMessageTooLarge, "a batch over retention")
	_, err = q.Write(ctx, msgs(1, 1001))
	assert.ErrorIs(t, err, ferry.ErrMessageTooLarge)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{nil})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
}

func TestMemoryQueueDropsByAge(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{MaxAge: time.Nanosecond})
	defer q.Close()
	_, err := q.Write(ctx, msgs(3, 1))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		oldest, next := q.Offsets()
		return oldest == 3 && next == 3
	}, 5*time.Second, time.Millisecond)
}

func TestMemoryQueueUnlimited(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited})
	defer q.Close()
	for range 30 {
		_, err := q.Write(ctx, msgs(100, 1))
		require.NoError(t, err)
	}
	oldest, next := q.Offsets()
	assert.Equal(t, int64(0), oldest)
	assert.Equal(t, int64(3000), next)
}

func TestMemoryQueueReadWakesAndHonoursContext(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{})
	got := make(chan int64, 1)
	go func() {
		dst := make([]*ferry.EnhancedMessage, 8)
		n, err := q.Read(ctx, 0, dst)
		if assert.NoError(t, err) && assert.Equal(t, 1, n) {
			got <- dst[0].Offset
		}
	}()
	_, err := q.Write(ctx, msgs(1, 1))
	require.NoError(t, err)
	assert.Equal(t, int64(0), <-got)

	short, cancel := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() {
		_, err := q.Read(short, 1, make([]*ferry.EnhancedMessage, 1))
		errs <- err
	}()
	cancel()
	assert.ErrorIs(t, <-errs, context.Canceled)

	go func() {
		_, err := q.Read(ctx, 1, make([]*ferry.EnhancedMessage, 1))
		errs <- err
	}()
	require.NoError(t, q.Close())
	assert.ErrorIs(t, <-errs, ferry.ErrClosed, "Close wakes blocked readers")
	require.NoError(t, q.Close())
	_, err = q.Write(ctx, msgs(1, 1))
	assert.ErrorIs(t, err, ferry.ErrClosed)
	_, err = q.TryWrite(msgs(1, 1))
	assert.ErrorIs(t, err, ferry.ErrClosed)
}

func TestMemoryQueueBlockOverflow(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{MaxMessages: 4, Overflow: ferry.Block})
	defer q.Close()
	_, err := q.Write(ctx, msgs(4, 1))
	require.NoError(t, err)
	_, err = q.TryWrite(msgs(1, 1))
	require.ErrorIs(t, err, ferry.ErrQueueFull)

	done := make(chan int64, 1)
	go func() {
		first, err := q.Write(ctx, msgs(2, 1))
		assert.NoError(t, err)
		done <- first
	}()
	q.Release(1) // one freed: not enough for two
	q.Release(2)
	assert.Equal(t, int64(4), <-done)
	oldest, next := q.Offsets()
	assert.Equal(t, int64(2), oldest)
	assert.Equal(t, int64(6), next)

	q.Release(1) // moving back is ignored
	_, err = q.TryWrite(msgs(1, 1))
	assert.ErrorIs(t, err, ferry.ErrQueueFull)

	errs := make(chan error, 1)
	go func() {
		_, err := q.Write(ctx, msgs(1, 1))
		errs <- err
	}()
	require.NoError(t, q.Close())
	assert.ErrorIs(t, <-errs, ferry.ErrClosed, "Close wakes blocked writers")
}

func TestMemoryStorage(t *testing.T) {
	ctx := context.Background()
	s := ferry.NewMemoryStorage()
	meta := ferry.TopicMeta{Name: "t", Queues: 2}
	q1, err := s.OpenQueue(ctx, meta, 1)
	require.NoError(t, err)
	q1again, err := s.OpenQueue(ctx, meta, 1)
	require.NoError(t, err)
	assert.Same(t, q1, q1again, "an open queue is shared")
	_, err = s.OpenQueue(ctx, meta, 2)
	assert.ErrorIs(t, err, ferry.ErrInvalidTopic)
	_, err = s.OpenQueue(ctx, ferry.TopicMeta{Name: "..", Queues: 1}, 0)
	assert.ErrorIs(t, err, ferry.ErrInvalidTopic)
	require.NoError(t, s.SaveTopic(ctx, meta))
	assert.ErrorIs(t, s.SaveTopic(ctx, ferry.TopicMeta{Name: "x"}), ferry.ErrInvalidTopic)
	topics, err := s.Topics(ctx)
	require.NoError(t, err)
	assert.Equal(t, []ferry.TopicMeta{meta.Normalized()}, topics)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err = q1.Write(ctx, msgs(1, 1))
	assert.ErrorIs(t, err, ferry.ErrClosed, "storage Close closes its queues")
	_, err = s.OpenQueue(ctx, meta, 0)
	assert.ErrorIs(t, err, ferry.ErrClosed)
	_, err = s.Topics(ctx)
	assert.ErrorIs(t, err, ferry.ErrClosed)
	assert.ErrorIs(t, s.SaveTopic(ctx, meta), ferry.ErrClosed)
}

// A Block queue drops what is released at once, not when room is next
// needed: released messages are garbage a memory queue should not keep.
func TestMemoryQueueReleaseDropsAtOnce(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{MaxMessages: 8, Overflow: ferry.Block})
	defer q.Close()
	_, err := q.Write(ctx, msgs(5, 10))
	require.NoError(t, err)
	q.Release(3)
	n, bytes := q.Len()
	assert.Equal(t, 2, n)
	assert.Equal(t, int64(20), bytes)
	oldest, next := q.Offsets()
	assert.Equal(t, int64(3), oldest)
	assert.Equal(t, int64(5), next)
	q.Release(9) // past the end: everything goes, offsets stay
	n, bytes = q.Len()
	assert.Equal(t, 0, n)
	assert.Zero(t, bytes)
	first, err := q.Write(ctx, msgs(1, 10))
	require.NoError(t, err)
	assert.Equal(t, int64(5), first)
}

func TestMemoryStorageTopicNotFound(t *testing.T) {
	s := ferry.NewMemoryStorage()
	defer s.Close()
	_, err := s.Topic(context.Background(), "nope")
	require.ErrorIs(t, err, ferry.ErrTopicNotFound)
	require.EqualError(t, err, `ferry: topic: topic not found: "nope"`)
}
