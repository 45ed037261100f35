package ferrytest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FailNthOf counts only the writes to its topic: a dead-letter write
// between two sends does not shift which send fails.
func TestFailNthOfCountsOneTopic(t *testing.T) {
	ctx := context.Background()
	b, st := ferrytest.NewFakeBroker(t)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "other", Queues: 1}))
	boom := errors.New("boom")
	st.FailNthOf("orders", 2, boom)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	send := func(topic string) error {
		_, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: []byte("x")})
		return err
	}
	require.NoError(t, send("orders"))
	require.NoError(t, send("other"))
	require.NoError(t, send("other"))
	require.ErrorIs(t, send("orders"), boom, "the second write to orders")
	require.NoError(t, send("orders"))
	assert.Len(t, st.Messages("orders"), 2)
}

// WaitFor returns once the condition holds, woken early by its channel.
func TestWaitFor(t *testing.T) {
	var n atomic.Int32
	wake := make(chan struct{}, 1)
	go func() {
		n.Store(3)
		wake <- struct{}{}
	}()
	ferrytest.WaitFor(t, time.Second, "n is 3", func() bool { return n.Load() == 3 }, wake)

	ft := &fakeTB{TB: t}
	ferrytest.WaitFor(ft, 5*time.Millisecond, "never", func() bool { return false }, nil)
	assert.True(t, ft.failed.Load(), "a condition that never holds fails the test")
}

// fakeTB records Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	failed atomic.Bool
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Fatalf(format string, a ...any) { f.failed.Store(true) }
