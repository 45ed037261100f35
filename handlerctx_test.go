package ferry_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestHandlerContextOutlivesTheCall: a handler's context stays the
// handler's after it returns: a goroutine it started (a database driver's
// statement watcher, say) reads it while the worker handles the next
// messages, and sees the same Delivery and no data race (before: the
// worker's pooled context was updated in place for each message).
func TestHandlerContextOutlivesTheCall(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered", "keyed"} {
		t.Run(mode, func(t *testing.T) {
			b := newTopic(t, 2)
			var wg sync.WaitGroup
			var wrong atomic.Int64
			const n = 200
			done := make(chan struct{}, n)
			h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
				d, _ := ferry.DeliveryFrom(ctx)
				wg.Go(func() {
					time.Sleep(time.Millisecond)
					_ = ctx.Err()
					select {
					case <-ctx.Done():
					default:
					}
					if later, ok := ferry.DeliveryFrom(ctx); !ok || later != d {
						wrong.Add(1)
					}
				})
				done <- struct{}{}
				return nil
			})
			var opts []ferry.ConsumerOption
			switch mode {
			case "ordered":
				opts = append(opts, ferry.Ordered())
			case "keyed":
				opts = append(opts, ferry.OrderedByKey(), ferry.WithConcurrency(4))
			}
			startConsumer(t, b, "g", h, opts...)
			p := newProducer(t, b)
			for i := range n {
				_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Key: strconv.Itoa(i % 7), Body: []byte("m")})
				require.NoError(t, err)
			}
			for range n {
				<-done
			}
			wg.Wait()
			assert.Zero(t, wrong.Load(), "a context read after its handler returned showed another delivery")
		})
	}
}
