package ferry_test

import (
	"context"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
)

// A group's lag: per queue and in all.
func ExampleBroker_Lag() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2})
	p, _ := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
	for range 10 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("x")})
	}
	_, _ = b.ResetGroup(ctx, "billing", "orders", ferry.ResetToOffsets(map[int]int64{0: 3}))
	lag, _ := b.Lag(ctx, "billing", "orders")
	for _, q := range lag.Queues {
		fmt.Printf("%s committed %d next %d lag %d\n", q.Queue, q.Committed, q.Next, q.Lag)
	}
	fmt.Println("total", lag.Lag)
	// Output:
	// orders[0] committed 3 next 5 lag 2
	// orders[1] committed -1 next 5 lag 5
	// total 7
}

// Replaying an idle group from a point in time.
func ExampleBroker_ResetGroup() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	p, _ := b.NewProducer()
	_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("yesterday")})
	offs, _ := b.ResetGroup(ctx, "billing", "orders", ferry.ResetToTime(time.Now().Add(time.Hour)))
	fmt.Println("after the last message:", offs)
	offs, _ = b.ResetGroup(ctx, "billing", "orders", ferry.ResetToTime(time.Time{}))
	fmt.Println("from the start:", offs)
	// Output:
	// after the last message: [1]
	// from the start: [0]
}

// Pausing a consumer while what it writes to is down: nothing is
// handled, the queues stay owned, Resume goes on from the same place.
func ExampleConsumer_Pause() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	var handled atomic.Int32
	done := make(chan struct{})
	c, _ := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		if handled.Add(1) == 3 {
			close(done)
		}
		return nil
	}))
	_ = c.Start(ctx)
	defer c.Close()
	_ = c.Pause()
	p, _ := b.NewProducer()
	for range 3 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("x")})
	}
	fmt.Println("paused:", c.Paused(), "handled:", handled.Load())
	_ = c.Resume()
	<-done
	fmt.Println("resumed, handled:", handled.Load())
	// Output:
	// paused: [orders[0]] handled: 0
	// resumed, handled: 3
}

// handledCounter is a hook counting handled messages, for metrics.
type handledCounter struct{ ok, failed atomic.Int64 }

func (h *handledCounter) OnHandled(_ context.Context, _ *ferry.EnhancedMessage, _ time.Duration, err error) {
	if err != nil {
		h.failed.Add(1)
		return
	}
	h.ok.Add(1)
}

// A hook that counts handled messages for every consumer of the broker.
func ExampleWithHooks() {
	ctx := context.Background()
	counter := &handledCounter{}
	b, _ := ferry.NewBroker(ferry.WithHooks(counter))
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	done := make(chan struct{})
	var n atomic.Int32
	c, _ := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		if n.Add(1) == 2 {
			close(done)
		}
		return nil
	}))
	_ = c.Start(ctx)
	p, _ := b.NewProducer()
	for range 2 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("x")})
	}
	<-done
	_ = c.Close() // the last OnHandled has returned
	_ = b.Close()
	fmt.Println("handled:", counter.ok.Load(), "failed:", counter.failed.Load())
	// Output: handled: 2 failed: 0
}

// sourceHeader is a send hook that adds a "source" header to what its
// producer sends, giving each message a Headers map of its own (the
// sender's map must not be changed).
type sourceHeader string

func (s sourceHeader) OnSend(_ context.Context, em *ferry.EnhancedMessage) {
	h := maps.Clone(em.Headers)
	if h == nil {
		h = map[string]string{}
	}
	h["source"] = string(s)
	em.Headers = h
}

// A hook on one producer sees that producer's sends only, after the
// broker's hooks.
func ExampleWithProducerHooks() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	billing, _ := b.NewProducer(ferry.WithProducerHooks(sourceHeader("billing")))
	other, _ := b.NewProducer()
	_, _ = billing.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("a")})
	_, _ = other.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("b")})

	q, _ := b.Queue("orders", 0)
	msgs := make([]*ferry.EnhancedMessage, 2)
	n, _ := q.Read(ctx, 0, msgs)
	for _, m := range msgs[:n] {
		fmt.Printf("%s source=%q\n", m.Body, m.Headers["source"])
	}
	// Output:
	// a source="billing"
	// b source=""
}
