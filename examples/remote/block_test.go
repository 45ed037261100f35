package remote_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestBlockTopicThroughBroker: on a topic with Block overflow and room
// for 8 messages a queue, a producer sends 200 (each Send waits for room)
// while a consumer group consumes; its commits reach the server's queue
// as Release calls, which make the room. Every message arrives, in order.
func TestBlockTopicThroughBroker(t *testing.T) {
	srv := startServer(t, memDir(t), "127.0.0.1:0")
	st := dial(t, srv.addr)
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang fails; it bounds no timing
	defer cancel()
	const topic, n = "blocking", 200
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: topic, Queues: 1, Retention: ferry.Retention{MaxMessages: 8, Overflow: ferry.Block}}))

	got := make(chan string, n)
	c, err := b.NewConsumer("drain", topic, ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		got <- string(m.Body)
		return nil
	}), ferry.WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	sent := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: fmt.Appendf(nil, "m-%03d", i)}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	done := sent
	for i := 0; i < n; {
		select {
		case body := <-got:
			require.Equal(t, fmt.Sprintf("m-%03d", i), body)
			i++
		case err := <-done:
			require.NoError(t, err, "sending stopped after %d delivered", i)
			done = nil // all sent: wait for the rest
		case <-ctx.Done():
			t.Fatalf("%d of %d delivered: the producer waits for room the consumer's commits should make", i, n)
		}
	}
	if done != nil {
		require.NoError(t, <-done)
	}
}
