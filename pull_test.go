package ferry_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPullConsumerPollCommitResume(t *testing.T) {
	cursors := ferry.NewMemoryCursorStore()
	t.Cleanup(func() { _ = cursors.Close() }) // after the consumers: their last commits go in
	b := newTopic(t, 2, ferry.WithCursorStore(cursors))
	produce(t, b, "t", "x", 40, 8)

	pc, err := b.NewPullConsumer("g", "t")
	require.NoError(t, err)
	_, err = pc.Poll(context.Background(), 0)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)

	seen := map[string]bool{}
	var kept []*ferry.EnhancedMessage
	for len(seen) < 40 {
		msgs, err := pc.Poll(context.Background(), 7)
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		require.LessOrEqual(t, len(msgs), 7)
		for _, m := range msgs {
			require.False(t, seen[string(m.Body)], "polled twice: %s", m.Body)
			seen[string(m.Body)] = true
			if m.Queue == 0 && m.Offset == 3 {
				kept = append(kept, m) // never committed
				continue
			}
			require.NoError(t, pc.Commit(context.Background(), m))
		}
	}
	assert.Equal(t, []ferry.QueueID{{"t", 0}, {"t", 1}}, pc.Assigned())
	require.NoError(t, pc.Close())
	require.NoError(t, pc.Close())
	_, err = pc.Poll(context.Background(), 1)
	require.ErrorIs(t, err, ferry.ErrClosed)
	require.ErrorIs(t, pc.Commit(context.Background(), kept...), ferry.ErrClosed)

	offs, err := cursors.Load(context.Background(), "t", "g", 2)
	require.NoError(t, err)
	assert.Equal(t, int64(3), offs[0], "the uncommitted message holds its queue's cursor")

	// The next member of the group gets queue 0 again from offset 3.
	again, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	require.NoError(t, err)
	defer again.Close()
	msgs, err := again.Poll(context.Background(), 100)
	require.NoError(t, err)
	require.NotEmpty(t, msgs)
	assert.Equal(t, int64(3), msgs[0].Offset)
	assert.Equal(t, 0, msgs[0].Queue)
}

func TestPullConsumerMessagesAutoCommit(t *testing.T) {
	cursors := ferry.NewMemoryCursorStore()
	t.Cleanup(func() { _ = cursors.Close() }) // after the consumers: their last commits go in
	b := newTopic(t, 1, ferry.WithCursorStore(cursors))
	produce(t, b, "t", "x", 10, 1)
	pc, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	require.NoError(t, err)
	var got []string
	for m, err := range pc.Messages(context.Background()) {
		require.NoError(t, err)
		got = append(got, string(m.Body))
		if len(got) == 6 {
			break
		}
	}
	assert.Equal(t, []string{"x0", "x1", "x2", "x3", "x4", "x5"}, got)
	require.NoError(t, pc.Close())
	offs, err := cursors.Load(context.Background(), "t", "g", 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{6}, offs)

	// A cancelled context ends the iteration with its error.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc2, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	require.NoError(t, err)
	defer pc2.Close()
	n := 0
	for m, err := range pc2.Messages(ctx) {
		if err != nil {
			require.ErrorIs(t, err, context.Canceled)
			break
		}
		assert.Equal(t, "x"+strconv.Itoa(6+n), string(m.Body))
		n++
		if n == 4 {
			cancel()
		}
	}
	assert.Equal(t, 4, n)
}

func TestPullAndPushShareAGroup(t *testing.T) {
	const n = 2000
	b := newTopic(t, 4)
	c := newTally(n)
	push := startConsumer(t, b, "g", c.handler(), ferry.WithMemberID("a-push"))
	pc, err := b.NewPullConsumer("g", "t", ferry.WithMemberID("b-pull"), ferry.WithAutoCommit())
	require.NoError(t, err)
	require.NoError(t, pc.Start(context.Background()))
	defer pc.Close()
	require.Eventually(t, func() bool { return len(push.Assigned()) == 2 && len(pc.Assigned()) == 2 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, []ferry.QueueID{{"t", 2}, {"t", 3}}, pc.Assigned())

	produce(t, b, "t", "x", n, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		for m, err := range pc.Messages(ctx) {
			if err != nil {
				return
			}
			c.add(string(m.Body))
		}
	}()
	c.waitAll(t)
	cancel()
	<-pulled
	assert.Zero(t, c.duplicates())
}

func TestPullConsumerOptions(t *testing.T) {
	b := newTopic(t, 1)
	for _, o := range []ferry.ConsumerOption{ferry.Ordered(), ferry.WithConcurrency(2), ferry.WithRetry(2, time.Second), ferry.WithDeadLetter("x")} {
		_, err := b.NewPullConsumer("g", "t", o)
		require.ErrorIs(t, err, ferry.ErrInvalidOption)
	}
}

// ExamplePullConsumer_Poll pulls messages and commits them.
func ExamplePullConsumer_Poll() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "events", Queues: 1})
	p, _ := b.NewProducer()
	for i := range 3 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "events", Body: fmt.Appendf(nil, "event %d", i)})
	}

	pc, err := b.NewPullConsumer("audit", "events")
	if err != nil {
		panic(err)
	}
	defer pc.Close()
	var bodies []string
	for len(bodies) < 3 {
		msgs, err := pc.Poll(ctx, 10)
		if err != nil {
			panic(err)
		}
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
		}
		if err := pc.Commit(ctx, msgs...); err != nil {
			panic(err)
		}
	}
	sort.Strings(bodies)
	fmt.Println(bodies)
	// Output:
	// [event 0 event 1 event 2]
}

// A huge max is no reason to allocate: Poll returns what one queue holds.
func TestPullConsumerPollHugeMax(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "x", 10, 1)
	pc, err := b.NewPullConsumer("g", "t", ferry.WithBuffer(4, 1<<20))
	require.NoError(t, err)
	defer pc.Close()
	got := 0
	for got < 10 {
		msgs, err := pc.Poll(context.Background(), math.MaxInt)
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		require.LessOrEqual(t, len(msgs), 4, "no more than the buffer holds")
		require.NoError(t, pc.Commit(context.Background(), msgs...))
		got += len(msgs)
	}
	assert.Equal(t, 10, got)
}
