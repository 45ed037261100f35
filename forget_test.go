package ferry_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A group that left for good must not keep a Block topic blocked: a
// broadcast member with a generated ID forgets itself on Close, and
// ForgetGroup lets go of any other.
func TestBlockTopicForgetsGroupsThatLeft(t *testing.T) {
	ctx := context.Background()
	cursors := ferry.NewMemoryCursorStore()
	defer cursors.Close()
	b, err := ferry.NewBroker(ferry.WithCursorStore(cursors))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1,
		Retention: ferry.Retention{MaxMessages: 4, Overflow: ferry.Block}}))
	noop := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })

	// Two readers that come and go before anything is sent: a clustering
	// group, and a broadcast member whose ID is generated.
	for _, opts := range [][]ferry.ConsumerOption{nil, {ferry.Broadcast()}} {
		group := "ghost"
		if opts != nil {
			group = "audit"
		}
		c, err := b.NewConsumer(group, "t", noop, opts...)
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		require.NoError(t, c.Close())
	}
	live := newTally(4)
	startConsumer(t, b, "live", live.handler())

	p := newProducer(t, b)
	for i := range 4 {
		_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	live.waitAll(t)
	require.Eventually(t, func() bool {
		offs, err := cursors.Load(ctx, "t", "live", 1)
		return err == nil && offs[0] == 4
	}, 10*time.Second, time.Millisecond, "the live group commits what it handled")
	_, err = p.TrySend(&ferry.Message{Topic: "t"})
	require.ErrorIs(t, err, ferry.ErrQueueFull, "the ghost group still holds the topic")

	require.ErrorIs(t, b.ForgetGroup(ctx, "live", "t"), ferry.ErrGroupActive)
	require.NoError(t, b.ForgetGroup(ctx, "never-seen", "t"))
	require.ErrorIs(t, b.ForgetGroup(ctx, "ghost", "nope"), ferry.ErrTopicNotFound)
	require.ErrorIs(t, b.ForgetGroup(ctx, "", "t"), ferry.ErrInvalidOption)
	require.NoError(t, b.ForgetGroup(ctx, "ghost", "t"))
	_, err = p.TrySend(&ferry.Message{Topic: "t"})
	require.NoError(t, err, "only the live group, done with everything, holds the topic now; the broadcast member forgot itself")

	offs, err := cursors.Load(ctx, "t", "ghost", 1)
	require.NoError(t, err)
	assert.Equal(t, int64(-1), offs[0], "a forgotten group's cursor is deleted, so it stays forgotten after a restart")
}
