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

// watch fails the test if ch is not closed within a generous watchdog.
func watch(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("watchdog: %s", what)
	}
}

// Slow handling is shared: the messages of one queue run on every worker
// at once. The handler blocks until four of its calls run together.
func TestConsumerSharesSlowHandlingAcrossWorkers(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 8, 1)
	running := make(chan struct{}, 8)
	four := make(chan struct{})
	c := newTally(8)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		running <- struct{}{}
		if len(running) == 4 {
			close(four)
		}
		select {
		case <-four:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.add(string(m.Body))
		return nil
	})
	startConsumer(t, b, "g", h, ferry.WithConcurrency(4))
	watch(t, four, "four handler calls never ran at once")
	c.waitAll(t)
}

// A fetched batch its filter drops entirely still moves the cursor while
// the consumer runs, not only when it stops.
func TestConsumerFilteredBatchCommitsWhileRunning(t *testing.T) {
	cursors := ferry.NewMemoryCursorStore()
	t.Cleanup(func() { _ = cursors.Close() }) // after the consumers: their last commits go in
	b := newTopic(t, 1, ferry.WithCursorStore(cursors))
	p, err := b.NewProducer()
	require.NoError(t, err)
	send := func(tag string, n int) {
		for i := range n {
			_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Tag: tag, Body: []byte(tag + strconv.Itoa(i))})
			require.NoError(t, err)
		}
	}
	send("red", 10)
	c := newTally(10)
	startConsumer(t, b, "g", c.handler(), ferry.WithTags("red"))
	c.waitAll(t)
	committed := func(want int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			offs, err := cursors.Load(context.Background(), "t", "g", 1)
			return err == nil && offs[0] == want
		}, 60*time.Second, time.Millisecond, "cursor never reached %d", want)
	}
	committed(10)
	send("green", 10) // all filtered out: only the fetch can move the cursor
	committed(20)
	assert.Equal(t, 10, c.distinct())
}
