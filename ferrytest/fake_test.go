package ferrytest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errDisk = errors.New("disk on fire")

func msg(body string) *ferry.EnhancedMessage {
	return &ferry.EnhancedMessage{Message: ferry.Message{Topic: "orders", Body: []byte(body)}}
}

func batch(bodies ...string) []*ferry.EnhancedMessage {
	out := make([]*ferry.EnhancedMessage, len(bodies))
	for i, b := range bodies {
		out[i] = msg(b)
	}
	return out
}

func bodies(msgs []*ferry.EnhancedMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	return out
}

func newFake() *ferrytest.FakeQueue {
	return ferrytest.NewFakeQueue(ferry.QueueID{Topic: "orders", Queue: 2}, ferry.Retention{})
}

func TestFakeQueueFailNth(t *testing.T) {
	q := newFake()
	defer q.Close()
	q.FailNth(2, errDisk)
	ctx := t.Context()

	first, err := q.Write(ctx, batch("a", "b"))
	require.NoError(t, err)
	assert.Equal(t, int64(0), first)
	_, err = q.Write(ctx, batch("c"))
	require.ErrorIs(t, err, errDisk)
	assert.Contains(t, err.Error(), "orders[2]")
	_, next := q.Offsets()
	assert.Equal(t, int64(2), next, "a failed write stores nothing")
	first, err = q.Write(ctx, batch("d"))
	require.NoError(t, err, "only the 2nd call fails")
	assert.Equal(t, int64(2), first)

	writes := q.Writes()
	require.Len(t, writes, 3)
	assert.Equal(t, []string{"a", "b"}, bodies(writes[0].Messages))
	assert.Equal(t, int64(0), writes[0].First)
	assert.NoError(t, writes[0].Err)
	assert.Equal(t, []string{"c"}, bodies(writes[1].Messages), "failed calls are recorded too")
	assert.Equal(t, int64(-1), writes[1].First)
	assert.ErrorIs(t, writes[1].Err, errDisk)
	assert.Equal(t, ferry.QueueID{Topic: "orders", Queue: 2}, writes[2].Queue)
	assert.Equal(t, []string{"a", "b", "d"}, bodies(q.Messages()))

	dst := make([]*ferry.EnhancedMessage, 8)
	n, err := q.Read(ctx, 0, dst)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "d"}, bodies(dst[:n]), "the queue behind holds what succeeded")
}

func TestFakeQueueRecordsCopies(t *testing.T) {
	q := newFake()
	defer q.Close()
	b := batch("a", "b")
	_, err := q.Write(t.Context(), b)
	require.NoError(t, err)
	b[0] = msg("scribbled")
	assert.Equal(t, []string{"a", "b"}, bodies(q.Writes()[0].Messages), "Writes keeps its own copy of the batch")
	w := q.Writes()
	w[0].Messages[1] = msg("scribbled")
	assert.Equal(t, []string{"a", "b"}, bodies(q.Messages()))
}

func TestFakeQueueFailWrites(t *testing.T) {
	q := newFake()
	defer q.Close()
	q.FailWrites(errDisk)
	for range 3 {
		_, err := q.Write(t.Context(), batch("x"))
		require.ErrorIs(t, err, errDisk)
		_, err = q.TryWrite(batch("y"))
		require.ErrorIs(t, err, errDisk, "TryWrite gets the faults too")
	}
	q.FailWrites(nil)
	first, err := q.Write(t.Context(), batch("z"))
	require.NoError(t, err)
	assert.Equal(t, int64(0), first)
	assert.Len(t, q.Writes(), 7)
	assert.Equal(t, []string{"z"}, bodies(q.Messages()))
}

func TestFakeQueueDelayNth(t *testing.T) {
	q := newFake()
	defer q.Close()
	q.DelayNth(1, time.Nanosecond)
	q.DelayNth(2, time.Hour)
	_, err := q.Write(t.Context(), batch("a"))
	require.NoError(t, err, "a short delay then the write goes through")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := q.Write(ctx, batch("b"))
		done <- err
	}()
	cancel()
	require.ErrorIs(t, <-done, context.Canceled, "a delayed write gives up with its context")
	assert.Equal(t, []string{"a"}, bodies(q.Messages()))
}

func TestFakeQueueOnWriteHoldsWriteInFlight(t *testing.T) {
	q := newFake()
	defer q.Close()
	entered, release := make(chan int, 1), make(chan struct{})
	q.OnWrite(func(ctx context.Context, call int, msgs []*ferry.EnhancedMessage) error {
		entered <- call
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := q.Write(t.Context(), batch("a"))
		done <- err
	}()
	assert.Equal(t, 1, <-entered)
	_, next := q.Offsets()
	assert.Equal(t, int64(0), next, "held in flight: nothing stored yet")
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, []string{"a"}, bodies(q.Messages()))

	q.OnWrite(func(context.Context, int, []*ferry.EnhancedMessage) error { return errDisk })
	_, err := q.Write(t.Context(), batch("b"))
	require.ErrorIs(t, err, errDisk)
	q.OnWrite(nil)
	_, err = q.Write(t.Context(), batch("c"))
	require.NoError(t, err)
}

func TestFakeQueueOnRead(t *testing.T) {
	q := newFake()
	defer q.Close()
	_, err := q.Write(t.Context(), batch("a"))
	require.NoError(t, err)
	var offsets []int64
	q.OnRead(func(_ context.Context, call int, offset int64) error {
		offsets = append(offsets, offset)
		if call == 2 {
			return errDisk
		}
		return nil
	})
	dst := make([]*ferry.EnhancedMessage, 1)
	n, err := q.Read(t.Context(), 0, dst)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, err = q.Read(t.Context(), 0, dst)
	require.ErrorIs(t, err, errDisk)
	assert.Equal(t, []int64{0, 0}, offsets)
}

func TestFakeStorageCountsAcrossQueues(t *testing.T) {
	s := ferrytest.NewFakeStorage()
	defer s.Close()
	ctx := t.Context()
	meta := ferry.TopicMeta{Name: "orders", Queues: 2}
	require.NoError(t, s.SaveTopic(ctx, meta))
	q0, err := s.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	q1, err := s.OpenQueue(ctx, meta, 1)
	require.NoError(t, err)
	assert.Same(t, q0, s.Queue("orders", 0))
	assert.Same(t, q1, s.Queue("orders", 1))
	assert.Nil(t, s.Queue("orders", 2))
	again, err := s.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	assert.Same(t, q0, again, "an open queue is handed out again")

	s.FailNth(2, errDisk)
	s.Queue("orders", 1).FailNth(2, errDisk) // the queue's own count
	_, err = q0.Write(ctx, batch("a"))
	require.NoError(t, err)
	_, err = q1.Write(ctx, batch("b"))
	require.ErrorIs(t, err, errDisk, "2nd write across the storage")
	_, err = q1.Write(ctx, batch("c"))
	require.ErrorIs(t, err, errDisk, "2nd write to queue 1")
	_, err = q1.Write(ctx, batch("d"))
	require.NoError(t, err)

	assert.Len(t, s.Writes(), 4)
	assert.Equal(t, []string{"a", "d"}, bodies(s.Messages("orders")))
	assert.Empty(t, s.Messages("payments"))

	require.NoError(t, s.Close())
	_, err = q0.Write(ctx, batch("e"))
	require.ErrorIs(t, err, ferry.ErrClosed, "Close closes the queues")
	assert.Len(t, s.Writes(), 5, "records stay after Close")
}

func TestFakeStorageReopensClosedQueueEmpty(t *testing.T) {
	s := ferrytest.NewFakeStorage()
	defer s.Close()
	meta := ferry.TopicMeta{Name: "orders", Queues: 1}
	q, err := s.OpenQueue(t.Context(), meta, 0)
	require.NoError(t, err)
	_, err = q.Write(t.Context(), batch("a"))
	require.NoError(t, err)
	require.NoError(t, q.Close())
	q2, err := s.OpenQueue(t.Context(), meta, 0)
	require.NoError(t, err)
	assert.NotSame(t, q, q2)
	assert.Same(t, q2, s.Queue("orders", 0))
	oldest, next := q2.Offsets()
	assert.Equal(t, [2]int64{0, 0}, [2]int64{oldest, next})
}

func TestNewBrokerClosedByCleanup(t *testing.T) {
	var b *ferry.Broker
	t.Run("user", func(t *testing.T) {
		b = ferrytest.NewBroker(t)
		require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
	})
	err := b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "later", Queues: 1})
	require.ErrorIs(t, err, ferry.ErrClosed, "the broker is closed when the test that made it ends")
}

// TestNewFakeBrokerPartialSendBatch shows the partial failure a fake can
// inject: SendBatch writes queue 0, then queue 1, whose write fails.
func TestNewFakeBrokerPartialSendBatch(t *testing.T) {
	var fs *ferrytest.FakeStorage
	t.Run("user", func(t *testing.T) {
		b, s := ferrytest.NewFakeBroker(t)
		fs = s
		ctx := t.Context()
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2}))
		p, err := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
		require.NoError(t, err)
		defer p.Close()

		fs.FailNth(2, errDisk)
		msgs := []*ferry.Message{
			{Topic: "orders", Body: []byte("m0")}, {Topic: "orders", Body: []byte("m1")},
			{Topic: "orders", Body: []byte("m2")}, {Topic: "orders", Body: []byte("m3")},
		}
		res, err := p.SendBatch(ctx, msgs)
		require.ErrorIs(t, err, errDisk)
		require.Len(t, res, 4)
		var landed, lost []string
		for i, r := range res {
			if r.Offset >= 0 {
				landed = append(landed, string(msgs[i].Body))
			} else {
				lost = append(lost, string(msgs[i].Body))
			}
		}
		require.Len(t, landed, 2, "the first queue's share landed")
		require.Len(t, lost, 2, "the second queue's share did not")
		assert.ElementsMatch(t, landed, bodies(fs.Messages("orders")))
		writes := fs.Writes()
		require.Len(t, writes, 2)
		assert.NoError(t, writes[0].Err)
		assert.ErrorIs(t, writes[1].Err, errDisk)
		assert.NotEqual(t, writes[0].Queue, writes[1].Queue)
	})
	_, err := fs.Topics(t.Context())
	require.ErrorIs(t, err, ferry.ErrClosed, "the storage is closed with the test")
}

// TestNewFakeBrokerConsumerReadFault shows a consumer tested over the
// fake: the first read fails, the consumer reports it, retries, and
// every message still arrives.
func TestNewFakeBrokerConsumerReadFault(t *testing.T) {
	b, fs := ferrytest.NewFakeBroker(t)
	ctx := t.Context()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}))
	fs.OnRead(func(_ context.Context, call int, _ int64) error {
		if call == 1 {
			return errDisk
		}
		return nil
	})
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for _, body := range []string{"a", "b", "c"} {
		_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte(body)})
		require.NoError(t, err)
	}

	got := make(chan string, 3)
	reported := make(chan error, 8)
	c, err := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		got <- string(m.Body)
		return nil
	}), ferry.WithOnError(func(err error) {
		select {
		case reported <- err:
		default:
		}
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()

	require.ErrorIs(t, <-reported, errDisk, "the consumer reports the failed read")
	assert.ElementsMatch(t, []string{"a", "b", "c"}, []string{<-got, <-got, <-got})
}

// FakeClock.WaitForTimers, the one method of a fake outside the
// conformance suites that takes a context, refuses a nil one.
func TestFakeClockWaitForTimersNilContext(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Now())
	var err error
	require.NotPanics(t, func() {
		err = clock.WaitForTimers(nil, 1) //lint:ignore SA1012 a nil context is the input under test
	})
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}
