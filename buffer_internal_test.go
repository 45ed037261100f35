package ferry

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Abandoning a message twice, or finishing one that was abandoned, must
// not count it out of flight twice: a negative in-flight count would make
// WaitDrained wait forever.
func TestBufferAbandonIsIdempotent(t *testing.T) {
	b := newBuffer(BufferConfig{}.withDefaults())
	msgs := []*EnhancedMessage{{Offset: 0}, {Offset: 1}}
	n, err := b.Put(context.Background(), msgs)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	k, _ := b.Take(make([]*EnhancedMessage, 2))
	require.Equal(t, 2, k)

	b.abandon(msgs[0], msgs[0])
	b.abandon(msgs[0])
	st := b.Stats()
	assert.Equal(t, 1, st.InFlight)
	assert.Equal(t, 2, st.Messages, "abandoned messages stay unfinished")

	assert.Equal(t, int64(1), b.Done(msgs[0]), "an abandoned message can still be done")
	st = b.Stats()
	assert.Equal(t, 1, st.InFlight)
	assert.Equal(t, 1, st.Messages)

	b.Done(msgs[1])
	assert.Zero(t, b.Stats().InFlight)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, b.WaitDrained(ctx))
}

// The reported case end to end: a 1000 KiB message behind a 100 KiB one
// still being handled does not fit a 1 MiB buffer, so the fetch loop waits
// in Put (the buffer reports paused, under its low watermark) instead of
// spinning, and puts it once the first is done.
func TestConsumerWaitsForRoomForALargeMessage(t *testing.T) {
	const kib = 1 << 10
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(context.Background(), TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for _, size := range []int{100 * kib, 1000 * kib} {
		_, err := p.Send(context.Background(), &Message{Topic: "t", Body: make([]byte, size)})
		require.NoError(t, err)
	}

	gate := make(chan struct{})
	handled := make(chan int, 2)
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if m.Offset == 0 {
			<-gate
		}
		handled <- len(m.Body)
		return nil
	})
	c, err := b.NewConsumer("g", "t", h, WithBuffer(1000, 1<<20))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Close()
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	defer openGate() // before Close, should the test fail with the handler held

	c.m.mu.Lock()
	buf := c.m.runs[0].buf
	c.m.mu.Unlock()
	require.Eventually(t, func() bool { return buf.Stats().Paused }, 10*time.Second, time.Millisecond,
		"the fetch loop waits for the large message")
	st := buf.Stats()
	assert.Equal(t, 1, st.Messages)
	assert.Equal(t, int64(1), buf.Next(), "the large message is not in the buffer yet")

	openGate()
	assert.Equal(t, 100*kib, <-handled)
	assert.Equal(t, 1000*kib, <-handled)
}
