package ferry_test

import (
	"context"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// topicTally counts handled messages by topic.
type topicTally struct {
	mu sync.Mutex
	n  map[string]int
}

func (tt *topicTally) handler() ferry.Handler {
	return ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		tt.mu.Lock()
		tt.n[m.Topic]++
		tt.mu.Unlock()
		return nil
	})
}

func (tt *topicTally) get(topic string) int {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return tt.n[topic]
}

// TestMultiConsumer: one consumer over two topics handles both, tells
// them apart by Message.Topic, splits each topic's queues with another
// member of the group, and pauses one topic's queue alone.
func TestMultiConsumer(t *testing.T) {
	ctx := t.Context()
	b := newTopic(t, 2) // "t"
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "u", Queues: 2}))
	tt := &topicTally{n: map[string]int{}}
	mc, err := b.NewMultiConsumer("g", []string{"t", "u"}, tt.handler())
	require.NoError(t, err)
	require.NoError(t, mc.Start(ctx))
	defer mc.Close()
	assert.Equal(t, []string{"t", "u"}, mc.Topics())
	require.NoError(t, mc.Pause(ferry.QueueID{Topic: "u", Queue: 0}))
	require.ErrorIs(t, mc.Pause(ferry.QueueID{Topic: "nope", Queue: 0}), ferry.ErrInvalidOption)
	p := newProducer(t, b)
	toPaused := 0
	for _, topic := range []string{"t", "u"} {
		for _, key := range []string{"a", "b", "c", "d"} {
			res, err := p.Send(ctx, &ferry.Message{Topic: topic, Key: key, Body: []byte("m")})
			require.NoError(t, err)
			if res.Queue == (ferry.QueueID{Topic: "u", Queue: 0}) {
				toPaused++
			}
		}
	}
	ferrytest.WaitFor(t, 10*time.Second, "t's messages, and u's not in the paused queue", func() bool {
		return tt.get("t") == 4 && tt.get("u") == 4-toPaused
	}, nil)
	time.Sleep(20 * time.Millisecond) // the paused queue's would come by now
	assert.Equal(t, 4-toPaused, tt.get("u"), "the paused queue's messages wait")
	require.NoError(t, mc.Resume())
	ferrytest.WaitFor(t, 10*time.Second, "u's messages after the resume", func() bool { return tt.get("u") == 4 }, nil)
	stats := mc.Stats()
	assert.Equal(t, uint64(4), stats["t"].Handled)
	assert.Equal(t, uint64(4), stats["u"].Handled)
	assert.Len(t, mc.Assigned(), 4, "every queue of both topics")

	_, err = b.NewMultiConsumer("g", nil, tt.handler())
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewMultiConsumer("g", []string{"t", "t"}, tt.handler())
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	bad, err := b.NewMultiConsumer("g2", []string{"t", "missing"}, tt.handler())
	require.NoError(t, err)
	require.ErrorIs(t, bad.Start(ctx), ferry.ErrTopicNotFound)
	require.NoError(t, bad.Close())
}

// TestPatternConsumer: a pattern consumer picks up a topic created after
// Start and lets go of one deleted.
func TestPatternConsumer(t *testing.T) {
	ctx := t.Context()
	b := newTopic(t, 1) // "t": does not match
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders.eu", Queues: 1}))
	tt := &topicTally{n: map[string]int{}}
	mc, err := b.NewPatternConsumer("g", regexp.MustCompile(`^orders\.`), tt.handler())
	require.NoError(t, err)
	require.NoError(t, mc.Start(ctx))
	defer mc.Close()
	assert.Equal(t, []string{"orders.eu"}, mc.Topics())
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders.us", Queues: 1}))
	ferrytest.WaitFor(t, 10*time.Second, "the new topic picked up", func() bool {
		return len(mc.Topics()) == 2
	}, nil)
	p := newProducer(t, b)
	for _, topic := range []string{"t", "orders.eu", "orders.us"} {
		_, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: []byte("m")})
		require.NoError(t, err)
	}
	ferrytest.WaitFor(t, 10*time.Second, "both matching topics' messages", func() bool {
		return tt.get("orders.eu") == 1 && tt.get("orders.us") == 1
	}, nil)
	assert.Zero(t, tt.get("t"))
	_, ok := mc.Consumer("orders.eu")
	require.True(t, ok)
	require.NoError(t, b.DeleteTopic(ctx, "orders.eu", ferry.ForceDelete()))
	ferrytest.WaitFor(t, 10*time.Second, "the deleted topic let go", func() bool {
		return len(mc.Topics()) == 1
	}, nil)
	assert.Equal(t, []string{"orders.us"}, mc.Topics())

	_, err = b.NewPatternConsumer("g", nil, tt.handler())
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// TestMultiPullConsumer: a pull consumer over two topics gets both
// topics' messages, turn by turn, commits each through its topic's
// cursor, and, with WithAutoCommit, its iterator finishes what it yields.
func TestMultiPullConsumer(t *testing.T) {
	ctx := t.Context()
	b := newTopic(t, 2) // "t"
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "u", Queues: 1}))
	p := newProducer(t, b)
	for _, topic := range []string{"t", "u"} {
		for range 5 {
			_, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: []byte(topic)})
			require.NoError(t, err)
		}
	}
	mc, err := b.NewMultiPullConsumer("g", []string{"u", "t"}, ferry.WithStartFrom(ferry.Earliest))
	require.NoError(t, err)
	defer mc.Close()
	assert.Equal(t, []string{"t", "u"}, mc.Topics())
	got := map[string]int{}
	var firstTwo []string
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for got["t"]+got["u"] < 10 {
		msgs, err := mc.Poll(pctx, 100)
		require.NoError(t, err)
		for _, m := range msgs {
			got[m.Topic]++
		}
		if len(firstTwo) < 2 {
			firstTwo = append(firstTwo, msgs[0].Topic)
		}
		require.NoError(t, mc.Commit(ctx, msgs...))
	}
	assert.Equal(t, map[string]int{"t": 5, "u": 5}, got)
	assert.NotEqual(t, firstTwo[0], firstTwo[1], "the topics take turns")
	for _, topic := range []string{"t", "u"} {
		lag, err := b.Lag(ctx, "g", topic)
		require.NoError(t, err)
		assert.Zero(t, lag.Lag, "topic %s committed", topic)
	}
	require.ErrorIs(t, mc.Commit(ctx, &ferry.EnhancedMessage{Message: ferry.Message{Topic: "nope"}}), ferry.ErrInvalidOption)
	_, err = mc.Poll(ctx, 0)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewMultiPullConsumer("g", []string{"t", "t"})
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewMultiPullConsumer("g", nil)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)

	// The iterator, auto-committing, over new messages.
	auto, err := b.NewMultiPullConsumer("a", []string{"t", "u"}, ferry.WithStartFrom(ferry.Earliest), ferry.WithAutoCommit())
	require.NoError(t, err)
	defer auto.Close()
	n := 0
	for m, err := range auto.Messages(pctx) {
		require.NoError(t, err)
		require.NotNil(t, m)
		if n++; n == 10 {
			break
		}
	}
	ferrytest.WaitFor(t, 10*time.Second, "the iterator's messages committed", func() bool {
		lt, err1 := b.Lag(ctx, "a", "t")
		lu, err2 := b.Lag(ctx, "a", "u")
		return err1 == nil && err2 == nil && lt.Lag == 0 && lu.Lag == 0
	}, nil)
	require.NoError(t, auto.Close())
	for _, err := range auto.Messages(ctx) {
		require.ErrorIs(t, err, ferry.ErrClosed)
	}
}
