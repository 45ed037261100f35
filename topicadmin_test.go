package ferry_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// DeleteTopic refuses a topic with a live group unless forced, then
// frees the topic, its files and its groups' cursors.
func TestDeleteTopic(t *testing.T) {
	ctx := context.Background()
	for name, open := range adminBackends(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			produce(t, b, "t", "m", 30, 3)
			tl := newTally(30)
			c, err := b.NewConsumer("g", "t", tl.handler())
			require.NoError(t, err)
			require.NoError(t, c.Start(ctx))
			tl.waitAll(t)

			require.ErrorIs(t, b.DeleteTopic(ctx, "t"), ferry.ErrGroupActive)
			_, ok := b.Topic("t")
			require.True(t, ok, "refused: nothing changed")
			require.ErrorIs(t, b.DeleteTopic(ctx, "nope", ferry.ForceDelete()), ferry.ErrTopicNotFound)

			require.NoError(t, b.DeleteTopic(ctx, "t", ferry.ForceDelete()))
			require.ErrorIs(t, c.Start(ctx), ferry.ErrClosed, "the topic's consumer was closed")
			_, ok = b.Topic("t")
			assert.False(t, ok)
			p := newProducer(t, b)
			_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
			require.ErrorIs(t, err, ferry.ErrTopicNotFound)
			groups, err := b.Groups(ctx, "%DLQ%g")
			require.NoError(t, err)
			assert.Empty(t, groups)

			// The name can be used again, from scratch.
			require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
			_, err = b.Lag(ctx, "g", "t")
			require.ErrorIs(t, err, ferry.ErrGroupNotFound, "the old group's cursors are gone")
		})
	}
}

// A deleted topic's files are gone, and stay gone after a reopen.
func TestDeleteTopicFilestoreFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := filestore.Open(dir)
	require.NoError(t, err)
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "gone", Queues: 2}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "kept", Queues: 1}))
	require.NoError(t, b.DeleteTopic(ctx, "gone"))
	_, err = os.Stat(filepath.Join(dir, "topics", "gone"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, b.Close())
	require.NoError(t, st.Close())
	st, err = filestore.Open(dir)
	require.NoError(t, err)
	defer st.Close()
	metas, err := st.Topics(ctx)
	require.NoError(t, err)
	require.Len(t, metas, 1)
	assert.Equal(t, "kept", metas[0].Name)
}

// A storage that cannot delete topics says so.
func TestDeleteTopicNeedsTopicDeleter(t *testing.T) {
	b, _ := ferrytest.NewFakeBroker(t)
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1}))
	require.ErrorIs(t, b.DeleteTopic(context.Background(), "t", ferry.ForceDelete()), ferry.ErrInvalidOption)
}

// AddQueues grows a topic: offsets stay, consumers rebalance over the new
// queues, producers route over them; shrinking is refused.
func TestAddQueues(t *testing.T) {
	ctx := context.Background()
	for name, open := range adminBackends(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t) // 3 queues
			produce(t, b, "t", "a", 30, 30)
			tl := newTally(30 + 1 + 60)
			a := startConsumer(t, b, "g", tl.handler(), ferry.WithMemberID("a"))
			bb := startConsumer(t, b, "g", tl.handler(), ferry.WithMemberID("b"))
			p := newProducer(t, b)
			_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("warm")}) // the producer caches the topic
			require.NoError(t, err)

			require.ErrorIs(t, b.AddQueues(ctx, "t", 2), ferry.ErrInvalidTopic)
			require.NoError(t, b.AddQueues(ctx, "t", 3), "the same count does nothing")
			require.NoError(t, b.AddQueues(ctx, "t", 6))
			meta, _ := b.Topic("t")
			assert.Equal(t, 6, meta.Queues)
			require.Eventually(t, func() bool { return len(union(t, a, bb)) == 6 }, watchdog, time.Millisecond,
				"the group owns the new queues")
			seen := map[int]bool{}
			for i := range 60 {
				res, err := p.Send(ctx, &ferry.Message{Topic: "t", Key: "k" + string(rune('A'+i)), Body: []byte("b" + string(rune('A'+i)))})
				require.NoError(t, err)
				seen[res.Queue.Queue] = true
			}
			assert.True(t, seen[3] || seen[4] || seen[5], "keys route over the new queues too: %v", seen)
			tl.waitAll(t)
			q0, err := b.Queue("t", 0)
			require.NoError(t, err)
			oldest, _ := q0.Offsets()
			assert.Equal(t, int64(0), oldest, "existing offsets stay")
		})
	}
}
