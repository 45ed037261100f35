package ferry_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queueCalls counts handler calls per queue.
type queueCalls struct {
	mu    sync.Mutex
	calls map[int]int
}

func (q *queueCalls) handler(tl *tally) ferry.Handler {
	return ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		q.mu.Lock()
		q.calls[m.Queue]++
		q.mu.Unlock()
		tl.add(string(m.Body))
		return nil
	})
}

func (q *queueCalls) count(queue int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.calls[queue]
}

// quiet is how long a test watches for handling that must not happen.
const quiet = 50 * time.Millisecond

// Pause stops handling and fetching without a rebalance; Resume goes on
// from the same place; one queue can be paused alone.
func TestConsumerPauseResume(t *testing.T) {
	b := newTopic(t, 2)
	calls := &queueCalls{calls: map[int]int{}}
	tl := newTally(200)
	c := startConsumer(t, b, "g", calls.handler(tl))
	require.ErrorIs(t, c.Pause(ferry.QueueID{Topic: "other", Queue: 0}), ferry.ErrInvalidOption)
	require.ErrorIs(t, c.Pause(ferry.QueueID{Topic: "t", Queue: 2}), ferry.ErrInvalidOption)

	require.NoError(t, c.Pause())
	assert.Equal(t, c.Assigned(), c.Paused())
	produceKeys(t, b, 0, 100)
	time.Sleep(quiet)
	assert.Zero(t, calls.count(0)+calls.count(1), "nothing is handled while paused")
	assert.Len(t, c.Assigned(), 2, "the queues stay owned")

	q1 := ferry.QueueID{Topic: "t", Queue: 1}
	require.NoError(t, c.Resume(q1))
	assert.Equal(t, []ferry.QueueID{{Topic: "t", Queue: 0}}, c.Paused())
	require.Eventually(t, func() bool { return calls.count(1) > 0 }, watchdog, time.Millisecond)
	time.Sleep(quiet)
	assert.Zero(t, calls.count(0), "queue 0 stays paused")

	require.NoError(t, c.Resume())
	assert.Empty(t, c.Paused())
	produceKeys(t, b, 100, 100)
	tl.waitAll(t)
	assert.Zero(t, tl.duplicates())
}

// produceKeys sends n messages with bodies from..from+n, keyed to spread
// over the queues.
func produceKeys(t *testing.T, b *ferry.Broker, from, n int) {
	t.Helper()
	p := newProducer(t, b)
	for i := from; i < from+n; i++ {
		_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Key: "k" + strconv.Itoa(i), Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
}

// A paused member keeps its pause, and the queues it keeps, across a
// rebalance of other members.
func TestConsumerPauseHoldsAcrossRebalance(t *testing.T) {
	b := newTopic(t, 4)
	calls := &queueCalls{calls: map[int]int{}}
	tl := newTally(200)
	a := startConsumer(t, b, "g", calls.handler(tl), ferry.WithMemberID("a"))
	require.NoError(t, a.Pause())
	other := newTally(0)
	startConsumer(t, b, "g", other.handler(), ferry.WithMemberID("b"))
	require.Eventually(t, func() bool { return len(a.Assigned()) == 2 }, watchdog, time.Millisecond)
	kept := a.Assigned()
	assert.Equal(t, kept, a.Paused(), "what a keeps stays paused")
	produceKeys(t, b, 0, 200)
	time.Sleep(quiet)
	for _, q := range kept {
		assert.Zero(t, calls.count(q.Queue), "queue %s is paused", q)
	}
	require.NoError(t, a.Resume())
	require.Eventually(t, func() bool {
		for _, q := range kept {
			if calls.count(q.Queue) == 0 {
				return false
			}
		}
		return true
	}, watchdog, time.Millisecond)
}

// A paused pull consumer polls nothing until resumed.
func TestPullConsumerPause(t *testing.T) {
	b := newTopic(t, 1)
	pc, err := b.NewPullConsumer("g", "t")
	require.NoError(t, err)
	defer pc.Close()
	require.NoError(t, pc.Start(context.Background()))
	require.NoError(t, pc.Pause())
	produce(t, b, "t", "m", 10, 1)
	ctx, cancel := context.WithTimeout(context.Background(), quiet)
	_, err = pc.Poll(ctx, 10)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "paused: nothing to poll")
	require.NoError(t, pc.Resume())
	ctx, cancel = context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	msgs, err := pc.Poll(ctx, 10)
	require.NoError(t, err)
	assert.Equal(t, int64(0), msgs[0].Offset, "from the same place")
}
