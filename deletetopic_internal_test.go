package ferry

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// Pausing a queue pauses its retries too, wherever they wait: after
// AddQueues a queue's retries may share a retry-topic queue with another
// queue's (the retry topic keeps the count it was made with), and that
// retry queue is paused while any of the queues whose retries it holds
// is; a retry reader started after the Pause starts paused.
func TestPauseCoversRetriesAfterAddQueues(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 2}))
	p, err := b.NewProducer(WithRouter(ManualRouter(0)))
	require.NoError(t, err)
	_, err = p.Send(ctx, &Message{Topic: "t", Body: []byte("first")})
	require.NoError(t, err)
	retried := make(chan struct{}, 16)
	c, err := b.NewConsumer("g", "t", HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if d, _ := DeliveryFrom(ctx); d.Attempt == 1 {
			return assert.AnError
		}
		retried <- struct{}{}
		return nil
	}), WithRetry(3, time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	<-retried // the retry topic exists (2 queues) and its reader runs
	c.retryMu.Lock()
	rc := c.retry
	c.retryMu.Unlock()
	require.NotNil(t, rc)
	retryPaused := func(q int) bool {
		rc.m.mu.Lock()
		defer rc.m.mu.Unlock()
		r := rc.m.runs[q]
		return r != nil && r.paused.Load()
	}
	require.Eventually(t, func() bool { return len(rc.Assigned()) == 2 }, 10*time.Second, time.Millisecond)

	require.NoError(t, b.AddQueues(ctx, "t", 4))
	require.Eventually(t, func() bool { return len(c.Assigned()) == 4 }, 10*time.Second, time.Millisecond)
	q := func(i int) QueueID { return QueueID{Topic: "t", Queue: i} }
	require.NoError(t, c.Pause(q(3)))
	assert.True(t, retryPaused(1), "queue 3's retries wait in retry queue 1 (3 mod 2)")
	assert.False(t, retryPaused(0))
	require.NoError(t, c.Pause(q(1)))
	require.NoError(t, c.Resume(q(3)))
	assert.True(t, retryPaused(1), "queue 1 is still paused, and its retries wait there too")
	require.NoError(t, c.Resume(q(1)))
	assert.False(t, retryPaused(1))
}

// A queue take in progress makes its own broker's workers yield, not
// every broker's in the process.
func TestUrgentIsPerBroker(t *testing.T) {
	ctx := context.Background()
	a, err := NewBroker()
	require.NoError(t, err)
	defer a.Close()
	other, err := NewBroker()
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, a.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	c, err := a.NewConsumer("g", "t", HandlerFunc(func(context.Context, *EnhancedMessage) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	require.Zero(t, a.urgent.Load(), "queue 0 taken")
	r := c.m.newRun(0, nil) // another take in progress
	assert.Equal(t, int32(1), a.urgent.Load())
	assert.Zero(t, other.urgent.Load(), "another broker's take")
	r.markReady()
	assert.Zero(t, a.urgent.Load())
}
