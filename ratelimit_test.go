package ferry_test

import (
	"context"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestRateLimit: the handler is never called faster than the limit (over
// a measured window, every window of a second holds at most 5% more
// than rate+burst calls; the run goes on at about the rate), in every mode,
// with many workers and queues; Close is prompt while calls wait.
func TestRateLimit(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered", "keyed"} {
		t.Run(mode, func(t *testing.T) {
			b := newTopic(t, 4)
			const rate, burst = 200, 5
			var mu sync.Mutex
			var calls []time.Time
			h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
				mu.Lock()
				calls = append(calls, time.Now())
				mu.Unlock()
				return nil
			})
			opts := []ferry.ConsumerOption{ferry.WithRateLimit(rate, burst), ferry.WithConcurrency(16)}
			switch mode {
			case "ordered":
				opts = append(opts, ferry.Ordered())
			case "keyed":
				opts = append(opts, ferry.OrderedByKey())
			}
			p := newProducer(t, b)
			for i := range 2000 {
				_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Key: strconv.Itoa(i), Body: []byte("m")})
				require.NoError(t, err)
			}
			c, err := b.NewConsumer("g", "t", h, append(opts, ferry.WithStartFrom(ferry.Earliest))...)
			require.NoError(t, err)
			start := time.Now()
			require.NoError(t, c.Start(t.Context()))
			time.Sleep(1500 * time.Millisecond)
			closing := time.Now()
			require.NoError(t, c.Close())
			assert.Less(t, time.Since(closing), time.Second, "Close waits for no rate-limited call")
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, calls)
			assert.Less(t, calls[0].Sub(start), time.Second, "the first call")
			elapsed := closing.Sub(calls[0]).Seconds()
			// The limit's precision is TestLimiterPrecision's; here, that
			// throttled calls go on at about the rate on a loaded machine.
			assert.GreaterOrEqual(t, float64(len(calls)), 0.5*rate*elapsed, "calls in %.2fs from the first", elapsed)
			for i := range calls {
				j := i
				for j < len(calls) && calls[j].Sub(calls[i]) < time.Second {
					j++
				}
				// Within 5%: a call's time is read in the handler, after
				// the scheduler let it run, so a late one can bunch with
				// the next (the bucket's own precision: TestLimiterPrecision).
				require.LessOrEqual(t, float64(j-i), rate*1.05+burst, "calls within one second from call %d", i)
			}
		})
	}
}

// TestRateLimitBadInput: a rate or burst below 1, or not a number.
func TestRateLimitBadInput(t *testing.T) {
	b := newTopic(t, 1)
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })
	for _, o := range []ferry.ConsumerOption{ferry.WithRateLimit(0, 1), ferry.WithRateLimit(10, 0), ferry.WithRateLimit(math.NaN(), 1), ferry.WithRateLimit(math.Inf(1), 1)} {
		_, err := b.NewConsumer("g", "t", h, o)
		require.ErrorIs(t, err, ferry.ErrInvalidOption)
	}
}
