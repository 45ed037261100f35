package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// TestHandlerTimeout: a handler that overruns WithHandlerTimeout has
// failed even when it returns nil: it is retried, then dead-lettered
// with ErrHandlerTimeout; one that says InProgress before its deadline
// runs past it and succeeds; the context carries the deadline and the
// cause. In every mode.
func TestHandlerTimeout(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered", "keyed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := newTopic(t, 1)
			// A wide margin: a loaded machine may not run the long
			// handler for a while between its InProgress calls.
			const limit = time.Second
			var slowCalls, longCalls atomic.Int64
			var sawDeadline, sawCause atomic.Bool
			h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
				if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= limit {
					sawDeadline.Store(true)
				}
				switch string(m.Body) {
				case "slow": // ignores nothing, but returns nil after its deadline
					slowCalls.Add(1)
					<-ctx.Done()
					if errors.Is(context.Cause(ctx), ferry.ErrHandlerTimeout) {
						sawCause.Store(true)
					}
					return nil
				case "long": // works 2.5 limits, saying so every twentieth of one
					longCalls.Add(1)
					for range 50 {
						time.Sleep(limit / 20)
						if err := ferry.InProgress(ctx); err != nil {
							return err
						}
					}
					return nil
				}
				return nil
			})
			opts := []ferry.ConsumerOption{ferry.WithHandlerTimeout(limit), ferry.WithRetry(2, time.Millisecond)}
			switch mode {
			case "ordered":
				opts = append(opts, ferry.Ordered())
			case "keyed":
				opts = append(opts, ferry.OrderedByKey())
			}
			c := startConsumer(t, b, "g", h, opts...)
			p := newProducer(t, b)
			for i, body := range []string{"slow", "long", "fast"} {
				_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Key: strconv.Itoa(i), Body: []byte(body)})
				require.NoError(t, err)
			}
			dlq, err := b.NewPullConsumer("reader", "%DLQ%g")
			require.NoError(t, err)
			require.NoError(t, dlq.Start(t.Context()))
			defer dlq.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			msgs, err := dlq.Poll(ctx, 1)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			assert.Equal(t, "slow", string(msgs[0].Body))
			assert.Contains(t, msgs[0].Headers[ferry.HeaderError], ferry.ErrHandlerTimeout.Error())
			assert.Equal(t, int64(2), slowCalls.Load(), "attempted twice, then dead-lettered")
			ferrytest.WaitFor(t, 0, "the long handler done", func() bool { return c.Stats().Handled >= 2 }, nil)
			assert.Equal(t, int64(1), longCalls.Load(), "InProgress kept the long call alive: one attempt")
			assert.True(t, sawDeadline.Load(), "the context carries the deadline")
			assert.True(t, sawCause.Load(), "the context's cause is ErrHandlerTimeout")
		})
	}
}

// TestInProgressOutsideALimit: InProgress outside a handler with a time
// limit does nothing; with a nil or done context it says so.
func TestInProgressOutsideALimit(t *testing.T) {
	require.NoError(t, ferry.InProgress(context.Background()))
	//lint:ignore SA1012 a nil context is the bad input under test
	require.ErrorIs(t, ferry.InProgress(nil), ferry.ErrInvalidOption) //nolint:staticcheck
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, ferry.InProgress(ctx), context.Canceled)
	b := newTopic(t, 1)
	_, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }), ferry.WithHandlerTimeout(-1))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}
