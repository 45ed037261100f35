package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestRetriesAreNotDeduplicated: a message that fails several times is
// retried each time, over a store that drops a write whose message ID it
// saw within its duplicate window (a JetStream Msg-Id). Each retry write
// has an ID of its own; the handler sees the original one every time.
// (The second retry of a message was dropped as a duplicate of the
// first, and the message lost.)
func TestRetriesAreNotDeduplicated(t *testing.T) {
	c := singleServer(t)
	prefix := fmt.Sprintf("rd%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	be := openBackend(t, c, prefix)
	defer be.Coordinator.Close()
	defer be.Storage.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(be.Storage), ferry.WithCursorStore(be.Cursors), ferry.WithCoordinator(be.Coordinator))
	require.NoError(t, err)
	defer b.Close()
	ctx := t.Context()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	var mu sync.Mutex
	var attempts []int
	var ids []ferry.MessageID
	done := make(chan struct{})
	cons, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, d.Attempt)
		ids = append(ids, m.ID)
		if d.Attempt < 4 {
			return errors.New("not yet")
		}
		close(done)
		return nil
	}), ferry.WithRetry(5, 10*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, cons.Start(ctx))
	defer cons.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	res, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("attempt 4 never came: attempts %v", attempts)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{1, 2, 3, 4}, attempts)
	for _, id := range ids {
		assert.Equal(t, res.ID, id, "the handler sees the message's own ID")
	}
}
