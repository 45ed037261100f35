package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stats counts what the consumer did and shows each held queue.
func TestConsumerStats(t *testing.T) {
	b := newTopic(t, 2)
	produce(t, b, "t", "m", 100, 10)
	tl := newTally(98)
	c := startConsumer(t, b, "g", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		switch {
		case m.Offset == 3 && d.Attempt == 1:
			return errors.New("once")
		case m.Offset == 5:
			return ferry.Permanent(errors.New("never"))
		}
		tl.add(string(m.Body))
		return nil
	}), ferry.WithRetry(3, time.Millisecond))
	tl.waitAll(t)
	var st ferry.ConsumerStats
	require.Eventually(t, func() bool {
		st = c.Stats()
		// 96 first attempts and the 2 retries of offset 3 succeed; offset 5 of each queue is dead-lettered.
		return st.DeadLettered == 2 && st.Handled == 98 && st.InFlight == 0
	}, watchdog, time.Millisecond)
	assert.Equal(t, uint64(2+2), st.Failed, "offset 3 of each queue once, offset 5 of each queue once")
	assert.Equal(t, uint64(2), st.Retried)
	require.Len(t, st.Queues, 2)
	for i, q := range st.Queues {
		assert.Equal(t, i, q.Queue.Queue)
		assert.False(t, q.Paused)
		assert.Zero(t, q.Buffer.InFlight)
	}
	assert.False(t, st.LastCommit.IsZero())
	require.Eventually(t, func() bool {
		st := c.Stats()
		return st.Queues[0].Committed+st.Queues[1].Committed == 100
	}, watchdog, time.Millisecond, "committed to the end: %+v", c.Stats().Queues)
}

// A pull consumer counts the messages committed.
func TestPullConsumerStats(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 10, 1)
	pc, err := b.NewPullConsumer("g", "t")
	require.NoError(t, err)
	defer pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	got := 0
	for got < 10 {
		msgs, err := pc.Poll(ctx, 10)
		require.NoError(t, err)
		require.NoError(t, pc.Commit(ctx, msgs...))
		got += len(msgs)
	}
	st := pc.Stats()
	assert.Equal(t, uint64(10), st.Handled)
	require.Len(t, st.Queues, 1)
	assert.Equal(t, int64(10), st.Queues[0].Committed)
}

// Start creates the dead-letter topic, so a reader of dead letters can
// start at boot.
func TestDeadLetterTopicExistsAfterStart(t *testing.T) {
	b := newTopic(t, 1)
	startConsumer(t, b, "g", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }))
	_, err := b.Queue("%DLQ%g", 0)
	require.NoError(t, err)
	dl, err := b.NewConsumer("audit", "%DLQ%g", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, dl.Start(context.Background()))
	require.NoError(t, dl.Close())
}

// Producer and broker stats count what was sent and what is open.
func TestProducerAndBrokerStats(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 2)
	p := newProducer(t, b)
	_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "t"}, {Topic: "t"}})
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "nope"})
	require.Error(t, err)
	assert.Equal(t, ferry.ProducerStats{Sent: 3, Failed: 1}, p.Stats())
	startConsumer(t, b, "g", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }))
	assert.Equal(t, ferry.BrokerStats{Topics: 2, Queues: 3, Consumers: 1}, b.Stats(), "t and the dead-letter topic")
}

// IsPermanent sees Permanent anywhere in a chain.
func TestIsPermanent(t *testing.T) {
	base := errors.New("bad input")
	assert.True(t, ferry.IsPermanent(ferry.Permanent(base)))
	assert.True(t, ferry.IsPermanent(fmt.Errorf("wrapped: %w", ferry.Permanent(base))))
	assert.False(t, ferry.IsPermanent(base))
	assert.False(t, ferry.IsPermanent(nil))
}
