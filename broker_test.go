package ferry_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCreateTopic(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 4)
	// Idempotent for equal metadata, defaults included.
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4, Retention: ferry.Retention{MaxMessages: ferry.DefaultRetentionMessages}}))
	assert.ErrorIs(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 5}), ferry.ErrTopicExists)
	assert.ErrorIs(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4, Retention: ferry.Retention{MaxMessages: 10}}), ferry.ErrTopicExists)

	for _, bad := range []ferry.TopicMeta{{Name: "", Queues: 1}, {Name: "..", Queues: 1}, {Name: "x", Queues: 0}, {Name: "x", Queues: -3}} {
		assert.ErrorIs(t, b.CreateTopic(ctx, bad), ferry.ErrInvalidTopic, "%+v", bad)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, b.CreateTopic(cancelled, ferry.TopicMeta{Name: "late", Queues: 1}), context.Canceled)
	_, ok := b.Topic("late")
	assert.False(t, ok, "a failed create leaves nothing")

	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "audit", Queues: 1}))
	meta, ok := b.Topic("orders")
	require.True(t, ok)
	assert.Equal(t, 4, meta.Queues)
	assert.Equal(t, int64(ferry.DefaultRetentionMessages), meta.Retention.MaxMessages)
	names := []string{}
	for _, m := range b.Topics() {
		names = append(names, m.Name)
	}
	assert.Equal(t, []string{"audit", "orders"}, names)

	_, err := b.Queue("orders", 4)
	assert.ErrorIs(t, err, ferry.ErrInvalidTopic)
	_, err = b.Queue("orders", -1)
	assert.ErrorIs(t, err, ferry.ErrInvalidTopic)
	_, err = b.Queue("nope", 0)
	assert.ErrorIs(t, err, ferry.ErrTopicNotFound)
	_, err = b.Queue("a/b", 0)
	assert.ErrorIs(t, err, ferry.ErrInvalidTopic)
}

func TestBrokerReloadsTopicsFromStorage(t *testing.T) {
	ctx := context.Background()
	st := ferry.NewMemoryStorage()
	defer st.Close()
	b1, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	require.NoError(t, b1.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 3}))
	require.NoError(t, b1.Close())
	require.NoError(t, b1.Close(), "Close is idempotent")

	b2, err := ferry.NewBroker(ferry.WithStorage(st))
	require.NoError(t, err)
	defer b2.Close()
	meta, ok := b2.Topic("orders")
	require.True(t, ok, "topics come back from the storage")
	assert.Equal(t, 3, meta.Queues)
	p := newProducer(t, b2)
	_, err = p.Send(ctx, &ferry.Message{Topic: "orders"})
	assert.NoError(t, err)
}

func TestBrokerFailsOnClosedStorage(t *testing.T) {
	st := ferry.NewMemoryStorage()
	require.NoError(t, st.Close())
	_, err := ferry.NewBroker(ferry.WithStorage(st))
	assert.ErrorIs(t, err, ferry.ErrClosed)
}
