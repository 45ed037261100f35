package natsstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestInProgressPastTheLeaseTTL (issue 31 item 3): a handler that works
// for three lease TTLs, under a time limit of half a TTL, says InProgress
// as it goes and finishes: the queue's lease, renewed by the member's
// session, is not lost, the message is handled once, and no other member
// gets its queue.
func TestInProgressPastTheLeaseTTL(t *testing.T) {
	const ttl = 2 * time.Second
	ctx := t.Context()
	c := singleServer(t)
	st := openStore(t, c, "inprogress")
	defer st.Close()
	co := openCoordinator(t, c, "inprogress", natsstore.WithTTL(ttl))
	defer co.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 1}))
	var calls, lost atomic.Int64
	done := make(chan error, 1)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		calls.Add(1)
		deadline := time.Now().Add(3 * ttl)
		for time.Now().Before(deadline) {
			time.Sleep(ttl / 8)
			if err := ferry.InProgress(ctx); err != nil {
				done <- err
				return err
			}
		}
		done <- nil
		return nil
	})
	cons, err := b.NewConsumer("g", "jobs", h, ferry.WithHandlerTimeout(ttl/2), ferry.WithOnRevoked(func(ferry.QueueID) { lost.Add(1) }))
	require.NoError(t, err)
	require.NoError(t, cons.Start(ctx))
	defer cons.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "jobs", Body: []byte("long")})
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err, "InProgress kept the call alive past three TTLs")
	case <-time.After(10 * ttl):
		t.Fatal("the long handler did not finish")
	}
	require.Eventually(t, func() bool { return cons.Stats().Handled == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, int64(1), calls.Load(), "handled once")
	assert.Zero(t, lost.Load(), "the queue was not revoked while the handler worked")
	assert.Equal(t, []ferry.QueueID{{Topic: "jobs", Queue: 0}}, cons.Assigned())
}
