package ferry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// jumpingClock is a fake clock that, when told to, moves on inside the
// next AfterFunc, before it sets the timer: the clock moving between the
// delayer's reading of it and its timer, as a test's Advance on another
// goroutine can.
type jumpingClock struct {
	*ferrytest.FakeClock
	jump atomic.Int64 // ns
}

func (c *jumpingClock) AfterFunc(d time.Duration, f func()) ferry.Timer {
	if j := c.jump.Swap(0); j > 0 {
		c.Advance(time.Duration(j))
	}
	return c.FakeClock.AfterFunc(d, f)
}

// A delayed message is delivered once the clock passes its due time,
// though the clock moved while the delayer set its timer: before, the
// timer was set for the wait computed before the move, so it fired that
// much late (never, when the test's clock moved no further), and the
// message waited for ever (TestSendAsyncDelayed hung once so).
func TestDelayTimerSetWhileTheClockMoves(t *testing.T) {
	for _, jump := range []time.Duration{30 * time.Second, 59 * time.Second} {
		t.Run(jump.String(), func(t *testing.T) {
			clock := &jumpingClock{FakeClock: ferrytest.NewFakeClock(time.Now())}
			b, _ := ferrytest.NewFakeBroker(t, ferry.WithClock(clock))
			ctx := t.Context()
			require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}))
			c, err := b.NewPullConsumer("g", "orders")
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			require.NoError(t, c.Start(ctx))
			p, err := b.NewProducer()
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			start := clock.Now()
			clock.jump.Store(int64(jump)) // the next timer the delayer sets
			_, err = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("later"), DeliverAt: start.Add(time.Minute)})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return clock.jump.Load() == 0 }, 10*time.Second, time.Millisecond, "the delayer sets a timer")
			clock.Advance(start.Add(time.Minute + 5*time.Second).Sub(clock.Now())) // past the due time, not past due+jump
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			ms, err := c.Poll(pctx, 1)
			require.NoError(t, err, "the delayed message arrives")
			require.Equal(t, "later", string(ms[0].Body))
		})
	}
}
