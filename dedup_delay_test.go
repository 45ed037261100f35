package ferry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// readTopic returns the messages stored in queue 0 of topic.
func readTopic(t *testing.T, b *ferry.Broker, topic string) []*ferry.EnhancedMessage {
	t.Helper()
	q, err := b.Queue(topic, 0)
	require.NoError(t, err)
	oldest, next := q.Offsets()
	dst := make([]*ferry.EnhancedMessage, next-oldest)
	if len(dst) == 0 {
		return nil
	}
	n, err := q.Read(context.Background(), oldest, dst)
	require.NoError(t, err)
	return dst[:n]
}

// A delayed Send retried with the same DedupKey waits, and is delivered,
// once: the retry reports the first one's place (a level's) as a
// duplicate. The delivered message carries the user's key. The same key
// on another topic is another message, although the delay levels are
// shared; a message without a key, sent after, is the control that the
// duplicate, had it been kept, would have arrived by then.
func TestDelayedSendDedupKey(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "other", Queues: 1}))
	p := newProducer(t, b)
	at := time.Now().Add(time.Second) // the sends below are placed long before it is due
	first, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k", Body: []byte("a"), DeliverAt: at})
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	again, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k", Body: []byte("b"), DeliverAt: at})
	require.NoError(t, err)
	assert.True(t, again.Duplicate, "a retried delayed send is a duplicate")
	assert.Equal(t, first.ID, again.ID)
	assert.Equal(t, first.Queue, again.Queue)
	assert.Equal(t, first.Offset, again.Offset)
	other, err := p.Send(ctx, &ferry.Message{Topic: "other", DedupKey: "k", Body: []byte("c"), DeliverAt: at})
	require.NoError(t, err)
	assert.False(t, other.Duplicate, "the same key for another topic")
	_, err = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("control"), DeliverAt: at})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return stored(t, b, "orders") >= 2 && stored(t, b, "other") >= 1 }, 10*time.Second, 5*time.Millisecond)
	got := readTopic(t, b, "orders")
	require.Len(t, got, 2, "the first and the control, once each")
	assert.Equal(t, "a", string(got[0].Body))
	assert.Equal(t, "k", got[0].DedupKey, "delivered with the user's key")
	assert.Equal(t, "control", string(got[1].Body))
	oth := readTopic(t, b, "other")
	require.Len(t, oth, 1)
	assert.Equal(t, "c", string(oth[0].Body))

	// Delivered, the key is the topic's: a Send of it within the window,
	// delayed or not, is a duplicate of the delivered message.
	now, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k", Body: []byte("d")})
	require.NoError(t, err)
	assert.True(t, now.Duplicate)
	assert.Equal(t, got[0].Offset, now.Offset)
}

// SendBatch and SendAsync place delayed messages with keys once, and say
// which were duplicates, within a batch or of an earlier send.
func TestDelayedBatchDedupKeys(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	p := newProducer(t, b)
	at := time.Now().Add(time.Hour)
	res, err := p.SendBatch(ctx, []*ferry.Message{
		{Topic: "orders", DedupKey: "a", DeliverAt: at},
		{Topic: "orders", DedupKey: "a", DeliverAt: at},
		{Topic: "orders", DedupKey: "b", DeliverAt: at},
		{Topic: "orders", DeliverAt: at},
	})
	require.NoError(t, err)
	require.Len(t, res, 4)
	assert.False(t, res[0].Duplicate)
	assert.True(t, res[1].Duplicate, "twice in one batch")
	assert.Equal(t, res[0].Offset, res[1].Offset)
	assert.False(t, res[2].Duplicate)
	assert.False(t, res[3].Duplicate)

	var r ferry.SendResult
	var rerr error
	require.NoError(t, p.SendAsync(ctx, &ferry.Message{Topic: "orders", DedupKey: "b", DeliverAt: at}, func(res ferry.SendResult, err error) { r, rerr = res, err }))
	require.NoError(t, p.Flush(ctx))
	require.NoError(t, rerr)
	assert.True(t, r.Duplicate, "an async send of a key placed before")
	assert.Equal(t, res[2].Offset, r.Offset)
	assert.Equal(t, res[2].Queue, r.Queue)
}

// On filestore a delayed message's key survives a restart: the retry of
// a Send whose answer was lost to a crash or a restart is a duplicate.
func TestDelayedDedupKeyAfterRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func() (*ferry.Broker, *filestore.Store) {
		st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever))
		require.NoError(t, err)
		b, err := ferry.NewBroker(ferry.WithStorage(st))
		require.NoError(t, err)
		return b, st
	}
	b, st := open()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	at := time.Now().Add(time.Hour)
	first, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k", DeliverAt: at})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, b.Close())
	require.NoError(t, st.Close())

	b, st = open()
	defer func() { require.NoError(t, st.Close()) }()
	defer func() { require.NoError(t, b.Close()) }()
	p = newProducer(t, b)
	again, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k", DeliverAt: at})
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, first.Offset, again.Offset)
	assert.Equal(t, first.ID, again.ID)
	other, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k2", DeliverAt: at})
	require.NoError(t, err)
	assert.False(t, other.Duplicate, "a control: another key is placed")
}
