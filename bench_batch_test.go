package ferry_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// BenchmarkBatchHandler drains a backlog of one queue of 100-byte
// messages with a batch handler (batches of up to 64) and with a
// per-message handler. Noop handlers do nothing; PerCall ones spend 2 µs
// per call (a flush, a round trip: what batching is for) and nothing per
// message. The metric is ns per message; BenchmarkBatchHandlerPair gives
// the ratio of the Noop pair measured alternately.
func BenchmarkBatchHandler(b *testing.B) {
	for _, bc := range []struct {
		name  string
		batch bool
		call  time.Duration
	}{
		{"Noop/Batch64", true, 0}, {"Noop/PerMessage", false, 0},
		{"PerCall2us/Batch64", true, 2 * time.Microsecond}, {"PerCall2us/PerMessage", false, 2 * time.Microsecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := drainBatch(b, b.N, bc.batch, bc.call)
			b.ReportMetric(float64(c.wall.Nanoseconds())/float64(b.N), "ns/msg")
			b.ReportMetric(float64(c.cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
		})
	}
}

// BenchmarkBatchHandlerPair drains 1,000,000 messages alternately with a
// batch handler (64) and a per-message one, 7 rounds each, both doing
// nothing: PerMessage/Batch64 of the median times is the speed-up
// (issue 31's goal: ≥ 1.5×).
func BenchmarkBatchHandlerPair(b *testing.B) {
	const n = 1_000_000
	for b.Loop() {
		pairRatio(b, 7, "Batch64", "PerMessage",
			func() cost { return drainBatch(b, n, true, 0) },
			func() cost { return drainBatch(b, n, false, 0) })
	}
}

// busy busies the goroutine for d; for 0 it does nothing (not even read
// the clock).
func busy(d time.Duration) {
	if d <= 0 {
		return
	}
	for start := time.Now(); time.Since(start) < d; {
	}
}

// drainBatch sends n 100-byte messages to a new broker's topic and
// drains them with a batch handler (up to 64) or a per-message one, each
// spending call per call; it returns the cost from the consumer's start.
func drainBatch(b *testing.B, n int, batch bool, call time.Duration) cost {
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
	body := make([]byte, 100)
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
		busy(call)
		count(1)
		return nil
	})
	if batch {
		h = ferry.Batch(ferry.BatchHandlerFunc(func(_ context.Context, ms []*ferry.EnhancedMessage) error {
			busy(call)
			count(len(ms))
			return nil
		}), 64)
	}
	c, err := br.NewConsumer("g", "t", h, ferry.WithStartFrom(ferry.Earliest))
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC() // the backlog's garbage is not the drain's to collect
	took := measure()
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-all
	spent := took()
	_ = c.Close()
	return spent
}
