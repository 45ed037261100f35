package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
)

// waitDelaysDrained waits until every delay level b has is moved through
// (its movers' cursors at the end), so that whatever waited in them was
// delivered or dropped.
func waitDelaysDrained(t *testing.T, b *ferry.Broker) {
	t.Helper()
	ferrytest.WaitFor(t, 10*time.Second, "the delay levels moved through", func() bool {
		for n := range 32 {
			name := "%DELAY%" + strconv.Itoa(n)
			if _, ok := b.Topic(name); !ok {
				continue
			}
			lag, err := b.Lag(t.Context(), "ferry-delay", name)
			if err != nil || lag.Lag > 0 {
				return false
			}
		}
		return true
	}, nil)
}

// TestForgottenGroupsWaitingRetriesAreGone (issue 27 defect 10): a
// retry still waiting in a delay level when its group is forgotten is not
// delivered to a new group of the same name (before: the new group got it
// as attempt 2). The retry topic the new group makes is another
// incarnation than the one the retry was bound for.
func TestForgottenGroupsWaitingRetriesAreGone(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := newTopic(t, 1, ferry.WithClock(clock))
	log := newAttemptLog(clock, func(string, int) error { return errors.New("fails") })
	c, err := b.NewConsumer("g", "t", log.handler(), ferry.WithRetry(3, time.Minute))
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	produce(t, b, "t", "f", 1, 1)
	ferrytest.WaitFor(t, 0, "the first attempt's retry", func() bool { return c.Stats().Retried == 1 }, nil)
	require.NoError(t, c.Close())
	require.NoError(t, b.ForgetGroup(t.Context(), "g", "t"))

	// The new group makes its retry topic anew: its own first retry.
	again := newAttemptLog(clock, func(body string, attempt int) error {
		if body == "x0" && attempt == 1 {
			return errors.New("once")
		}
		return nil
	})
	c2, err := b.NewConsumer("g", "t", again.handler(), ferry.WithStartFrom(ferry.Latest), ferry.WithRetry(3, time.Minute))
	require.NoError(t, err)
	require.NoError(t, c2.Start(t.Context()))
	defer c2.Close()
	produce(t, b, "t", "x", 1, 1)
	ferrytest.WaitFor(t, 0, "the new group's retry", func() bool { return c2.Stats().Retried == 1 }, nil)
	clock.Advance(time.Hour)
	waitDelaysDrained(t, b)
	ferrytest.WaitFor(t, 0, "the new group's retry handled", func() bool { return len(again.seen("x0")) == 2 }, again.wake)
	rq, err := b.Queue(retryTopic(t, "g", "t"), 0)
	require.NoError(t, err)
	_, next := rq.Offsets()
	assert.Equal(t, int64(1), next, "the forgotten group's retry was written to the new group's retry topic")
	assert.Empty(t, again.seen("f0"), "the forgotten group's retry came back")
}

// TestRecreatedTopicSeenByEveryBroker (issue 27 defect 8): a topic one
// broker deletes and creates again is the new topic in every broker
// sharing the storage (before: b2's producers got "closed" forever and
// b2.CreateTopic said nil). Over shared memory and over one filestore.
func TestRecreatedTopicSeenByEveryBroker(t *testing.T) {
	for _, name := range []string{"memory", "filestore"} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var storage ferry.Storage
			if name == "memory" {
				storage = ferry.NewMemoryStorage()
			} else {
				st, err := filestore.Open(t.TempDir())
				require.NoError(t, err)
				storage = st
			}
			defer storage.Close()
			cursors := ferry.NewMemoryCursorStore()
			defer cursors.Close()
			coord := ferry.NewMemoryCoordinator()
			defer coord.Close()
			open := func() *ferry.Broker {
				b, err := ferry.NewBroker(ferry.WithStorage(storage), ferry.WithCursorStore(cursors), ferry.WithCoordinator(coord))
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, b.Close()) })
				return b
			}
			b1, b2 := open(), open()
			meta := ferry.TopicMeta{Name: "t", Queues: 2}
			require.NoError(t, b1.CreateTopic(ctx, meta))
			p2, err := b2.NewProducer()
			require.NoError(t, err)
			defer p2.Close()
			_, err = p2.Send(ctx, &ferry.Message{Topic: "t", Key: "k", Body: []byte("old")})
			require.NoError(t, err)
			first, ok := b2.Topic("t")
			require.True(t, ok)

			require.NoError(t, b1.DeleteTopic(ctx, "t"))
			_, err = p2.Send(ctx, &ferry.Message{Topic: "t", Key: "k", Body: []byte("none")})
			require.ErrorIs(t, err, ferry.ErrTopicNotFound, "a send between the delete and the new topic")

			require.NoError(t, b1.CreateTopic(ctx, meta))
			res, err := p2.Send(ctx, &ferry.Message{Topic: "t", Key: "k", Body: []byte("new")})
			require.NoError(t, err, "b2's producer sends to the new topic")
			assert.Equal(t, int64(0), res.Offset, "the new topic starts empty")
			require.NoError(t, b2.CreateTopic(ctx, meta), "equal metadata: nil")
			second, ok := b2.Topic("t")
			require.True(t, ok)
			assert.NotEqual(t, first.Incarnation, second.Incarnation, "b2 sees the new incarnation")
			q, err := b1.Queue("t", res.Queue.Queue)
			require.NoError(t, err)
			msgs := make([]*ferry.EnhancedMessage, 4)
			n, err := q.Read(ctx, 0, msgs)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			assert.Equal(t, "new", string(msgs[0].Body), "b1 reads what b2 sent to the new topic")

			// A batch to a topic created again: refused once with
			// ErrClosed (a part of a batch may be stored, so it is not
			// sent again), then sent to the new topic.
			require.NoError(t, b1.DeleteTopic(ctx, "t"))
			require.NoError(t, b1.CreateTopic(ctx, meta))
			batch := []*ferry.Message{{Topic: "t", Key: "k", Body: []byte("b")}, {Topic: "t", Key: "k", Body: []byte("b")}}
			if _, err := p2.SendBatch(ctx, batch); err != nil {
				require.ErrorIs(t, err, ferry.ErrClosed)
				results, err := p2.SendBatch(ctx, batch)
				require.NoError(t, err, "the batch after goes to the new topic")
				assert.Equal(t, int64(1), results[1].Offset)
			}

			// Deleted and created again with other metadata through b1:
			// b2's CreateTopic with the old metadata is refused.
			require.NoError(t, b1.DeleteTopic(ctx, "t"))
			require.NoError(t, b1.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 3}))
			require.ErrorIs(t, b2.CreateTopic(ctx, meta), ferry.ErrTopicExists)
			got, ok := b2.Topic("t")
			require.True(t, ok)
			assert.Equal(t, 3, got.Queues)
		})
	}
}
