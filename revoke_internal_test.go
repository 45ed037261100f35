package ferry

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// After a revoke no handling starts: the unstarted rest of a batch a
// worker took goes back to the buffer, unfinished, for the next owner.
// One queue of 200 messages, one worker whose handler blocks on the
// first; the queue is revoked (by Close, or by a rebalance to a second
// member) while it blocks; once released, no other handler call of the
// first member may start.
func TestRevokeStopsTakenBatch(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered"} {
		for _, by := range []string{"close", "rebalance"} {
			t.Run(mode+"/"+by, func(t *testing.T) { revokeStopsTakenBatch(t, mode == "ordered", by == "rebalance") })
		}
	}
}

func revokeStopsTakenBatch(t *testing.T, ordered, rebalance bool) {
	const n = 200
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	// Two queues, every message on queue 0. Member "z" starts alone and
	// holds both; "a" joins and, sorting first, is given queue 0.
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 2}))
	p, err := b.NewProducer(WithRouter(ManualRouter(0)))
	require.NoError(t, err)
	for i := range n {
		_, err := p.Send(ctx, &Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}

	blocked := make(chan struct{})
	release := make(chan struct{})
	var revoked atomic.Bool
	var calls, afterRevoke atomic.Int64
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if revoked.Load() {
			afterRevoke.Add(1)
		}
		if calls.Add(1) == 1 {
			close(blocked)
			<-release
		}
		return nil
	})
	opts := []ConsumerOption{WithConcurrency(1), WithDrainTimeout(5 * time.Second), WithMemberID("z")}
	if ordered {
		opts = append(opts, Ordered())
	}
	c, err := b.NewConsumer("g", "t", h, opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	<-blocked
	c.m.mu.Lock()
	r := c.m.runs[0]
	c.m.mu.Unlock()
	require.NotNil(t, r)

	var wg sync.WaitGroup
	var c2 *Consumer
	var handled2 atomic.Int64
	if rebalance {
		c2, err = b.NewConsumer("g", "t", HandlerFunc(func(context.Context, *EnhancedMessage) error {
			handled2.Add(1)
			return nil
		}), WithMemberID("a"))
		require.NoError(t, err)
		wg.Go(func() { assert.NoError(t, c2.Start(ctx)) })
	} else {
		wg.Go(func() { assert.NoError(t, c.Close()) })
	}
	require.Eventually(t, r.releasing.Load, 10*time.Second, time.Millisecond, "queue 0 is revoked")
	revoked.Store(true)
	close(release)
	wg.Wait()
	if rebalance {
		require.Eventually(t, func() bool { return handled2.Load() == n-1 }, 10*time.Second, time.Millisecond, "the next owner handles the rest")
		require.NoError(t, c2.Close())
		require.NoError(t, c.Close())
	}
	assert.Zero(t, afterRevoke.Load(), "handler calls started after the revoke")
	assert.Equal(t, int64(1), calls.Load())
}

// A forced DeleteTopic ends every member the topic's consumers run,
// their retry readers included: none handles the deleted topic's
// messages afterwards.
func TestForceDeleteEndsRetryReaders(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	_, err = p.Send(ctx, &Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	second := make(chan struct{})
	var once sync.Once
	c, err := b.NewConsumer("g", "t", HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if d, _ := DeliveryFrom(ctx); d.Attempt >= 2 {
			once.Do(func() { close(second) })
		}
		return assert.AnError
	}), WithRetry(10, time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	<-second // the retry reader handles the message's second attempt
	require.Equal(t, 2, b.Stats().Consumers, "the consumer and its retry reader")

	require.NoError(t, b.DeleteTopic(ctx, "t", ForceDelete()))
	assert.Zero(t, b.Stats().Consumers, "members left running after the forced delete")
}
