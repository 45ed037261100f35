package ferry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// BenchmarkBatchHandler drains a backlog of one queue of 100-byte
// messages with a batch handler (batches of up to 64) and with a
// per-message handler (issue 31's goal: ≥ 1.5× with batches of 64).
// Noop handlers do nothing; PerCall ones spend 2 µs per call (a flush, a
// round trip: what batching is for) and nothing per message. ns/op is per
// message; compare msgs/s within one run.
func BenchmarkBatchHandler(b *testing.B) {
	body := make([]byte, 100)
	spin := func(d time.Duration) {
		for start := time.Now(); time.Since(start) < d; {
		}
	}
	for _, bc := range []struct {
		name  string
		batch bool
		call  time.Duration
	}{
		{"Noop/Batch64", true, 0}, {"Noop/PerMessage", false, 0},
		{"PerCall2us/Batch64", true, 2 * time.Microsecond}, {"PerCall2us/PerMessage", false, 2 * time.Microsecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			br, err := ferry.NewBroker()
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}); err != nil {
				b.Fatal(err)
			}
			p, _ := br.NewProducer()
			defer p.Close()
			n := b.N
			msgs := make([]*ferry.Message, 0, 256)
			for i := 0; i < n; i++ {
				msgs = append(msgs, &ferry.Message{Topic: "t", Body: body})
				if len(msgs) == cap(msgs) || i == n-1 {
					if _, err := p.SendBatch(ctx, msgs); err != nil {
						b.Fatal(err)
					}
					msgs = msgs[:0]
				}
			}
			var done atomic.Int64
			all := make(chan struct{})
			count := func(k int) {
				if done.Add(int64(k)) == int64(n) {
					close(all)
				}
			}
			var h ferry.Handler = ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
				spin(bc.call)
				count(1)
				return nil
			})
			if bc.batch {
				h = ferry.Batch(ferry.BatchHandlerFunc(func(_ context.Context, ms []*ferry.EnhancedMessage) error {
					spin(bc.call)
					count(len(ms))
					return nil
				}), 64)
			}
			c, err := br.NewConsumer("g", "t", h, ferry.WithStartFrom(ferry.Earliest))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			<-all
			elapsed := time.Since(start)
			b.StopTimer()
			_ = c.Close()
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
		})
	}
}
