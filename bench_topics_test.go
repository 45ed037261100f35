package ferry_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferry"
)

// BenchmarkCreateTopics creates 10,000 topics of one queue on a broker:
// one op is the whole 10,000.
func BenchmarkCreateTopics(b *testing.B) {
	ctx := context.Background()
	names := make([]string, 10000)
	for i := range names {
		names[i] = "topic-" + strconv.Itoa(i)
	}
	for b.Loop() {
		br, err := ferry.NewBroker()
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range names {
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: n, Queues: 1}); err != nil {
				b.Fatal(err)
			}
		}
		_ = br.Close()
	}
}

// BenchmarkStartConsumers times what an application with a topic per
// entity pays per topic: one op creates a topic of one queue, and a
// consumer on it with default options, and starts it.
func BenchmarkStartConsumers(b *testing.B) {
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })
	var cs []*ferry.Consumer
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		name := "topic-" + strconv.Itoa(i)
		i++
		if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: name, Queues: 1}); err != nil {
			b.Fatal(err)
		}
		c, err := br.NewConsumer("g", name, h)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	b.StopTimer()
	for _, c := range cs {
		_ = c.Close()
	}
}

// BenchmarkSpreadTopics sends messages round robin over 1, 1,000 or
// 10,000 topics with a consumer each: one op is one message, sent and
// handled.
func BenchmarkSpreadTopics(b *testing.B) {
	for _, topics := range []int{1, 1000, 10000} {
		b.Run(strconv.Itoa(topics), func(b *testing.B) { benchSpread(b, topics) })
	}
}

func benchSpread(b *testing.B, topics int) {
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	var handled atomic.Int64
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { handled.Add(1); return nil })
	names := make([]string, topics)
	for i := range names {
		names[i] = "topic-" + strconv.Itoa(i)
		if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: names[i], Queues: 1}); err != nil {
			b.Fatal(err)
		}
		c, err := br.NewConsumer("g", names[i], h)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
	}
	p, err := br.NewProducer()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	body := make([]byte, 100)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Send(ctx, &ferry.Message{Topic: names[i%topics], Body: body}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	for handled.Load() < int64(i) {
		runtime.Gosched()
	}
}
