package ferry_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferry"
)

// BenchmarkMultiTopic drains a backlog spread over 100 topics with one
// MultiConsumer and with 100 single-topic consumers (issue 31's goal: CPU
// per message ≤ 1.0× the single consumers'). cpu-ns/msg is the process's
// CPU time per message; compare within one run.
func BenchmarkMultiTopic(b *testing.B) {
	for _, multi := range []bool{true, false} {
		name := "Single100"
		if multi {
			name = "Multi100"
		}
		b.Run(name, func(b *testing.B) {
			c, n := drainTopics(b, b.N, multi)
			b.ReportMetric(float64(c.cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
		})
	}
}

// BenchmarkMultiTopicPair alternates the two, 7 rounds of 100,000
// messages each: Multi100/Single100 of the median CPU times is the
// figure, Multi100/Single100-cpu (goal ≤ 1.0).
func BenchmarkMultiTopicPair(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		pairRatio(b, 7, "Single100", "Multi100",
			func() cost { c, _ := drainTopics(b, n, false); return c },
			func() cost { c, _ := drainTopics(b, n, true); return c })
	}
}

// drainTopics spreads about n messages over 100 one-queue topics and
// drains them with one MultiConsumer or 100 consumers; it returns the
// drain's cost and the messages drained.
func drainTopics(b *testing.B, total int, multi bool) (cost, int) {
	const topics = 100
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	names := make([]string, topics)
	for i := range names {
		names[i] = "t" + strconv.Itoa(i)
		if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: names[i], Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}); err != nil {
			b.Fatal(err)
		}
	}
	p, _ := br.NewProducer()
	defer p.Close()
	per := max(1, total/topics)
	n := per * topics
	msgs := make([]*ferry.Message, 0, per)
	for _, t := range names {
		msgs = msgs[:0]
		for range per {
			msgs = append(msgs, &ferry.Message{Topic: t, Body: benchBody})
		}
		if _, err := p.SendBatch(ctx, msgs); err != nil {
			b.Fatal(err)
		}
	}
	var done atomic.Int64
	all := make(chan struct{})
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		if done.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	runtime.GC() // the backlog's garbage is not the drain's to collect
	took := measure()
	var closers []func() error
	if multi {
		mc, err := br.NewMultiConsumer("g", names, h, ferry.WithStartFrom(ferry.Earliest))
		if err != nil {
			b.Fatal(err)
		}
		if err := mc.Start(ctx); err != nil {
			b.Fatal(err)
		}
		closers = append(closers, mc.Close)
	} else {
		for _, t := range names {
			c, err := br.NewConsumer("g", t, h, ferry.WithStartFrom(ferry.Earliest))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			closers = append(closers, c.Close)
		}
	}
	<-all
	c := took()
	for _, c := range closers {
		_ = c()
	}
	return c, n
}
