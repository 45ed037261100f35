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
