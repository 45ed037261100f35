package ferry

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFlowControlHoldsBufferUnderHighWatermark(t *testing.T) {
	const n, capacity = 500, 40
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(context.Background(), TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for i := range n {
		_, err := p.Send(context.Background(), &Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}

	gate := make(chan struct{})
	var handled atomic.Int64
	all := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		<-gate // a slow handler: one message per token
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	})
	c, err := b.NewConsumer("g", "t", h, WithBuffer(capacity, 1<<20), WithWatermarks(0.75, 0.25), WithConcurrency(4))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Close()

	c.m.mu.Lock()
	buf := c.m.runs[0].buf
	c.m.mu.Unlock()
	high := int(capacity * 0.75)
	require.Eventually(t, func() bool { return buf.Stats().Paused }, 10*time.Second, time.Millisecond)
	st := buf.Stats()
	assert.LessOrEqual(t, st.Messages, high)
	assert.LessOrEqual(t, buf.Next(), int64(high), "fetching paused at the high watermark")

	for range n {
		gate <- struct{}{}
	}
	<-all
	st = buf.Stats()
	assert.LessOrEqual(t, st.PeakMessages, high, "the buffer never went above its high watermark")
	assert.Equal(t, int64(n), buf.Next())
}

func TestBlockTopicProducerResumesWhenConsumerCommits(t *testing.T) {
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(context.Background(), TopicMeta{Name: "t", Queues: 1,
		Retention: Retention{MaxMessages: 10, Overflow: Block}}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for i := range 10 {
		_, err := p.Send(context.Background(), &Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	_, err = p.TrySend(&Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, ErrQueueFull, "the topic is full")

	sent := make(chan error, 1)
	go func() {
		for i := 10; i < 100; i++ {
			if _, err := p.Send(context.Background(), &Message{Topic: "t", Body: []byte(strconv.Itoa(i))}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()

	var handled atomic.Int64
	all := make(chan struct{})
	c, err := b.NewConsumer("g", "t", HandlerFunc(func(context.Context, *EnhancedMessage) error {
		if handled.Add(1) == 100 {
			close(all)
		}
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Close()
	require.NoError(t, <-sent, "the blocked producer resumed as the consumer committed")
	<-all
}
