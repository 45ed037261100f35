package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// A batch handler gets the pending messages of a queue together: here,
// one insert for all of them, and one message failing alone.
func ExampleBatch() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "rows", Queues: 1})
	p, _ := b.NewProducer()
	defer p.Close()
	var msgs []*ferry.Message
	for _, v := range []string{"a", "b", "bad", "c"} {
		msgs = append(msgs, &ferry.Message{Topic: "rows", Body: []byte(v)})
	}
	_, _ = p.SendBatch(ctx, msgs)

	var mu sync.Mutex
	var stored []string
	done := make(chan struct{})
	h := ferry.Batch(ferry.BatchHandlerFunc(func(ctx context.Context, ms []*ferry.EnhancedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		failed := map[int]error{}
		for i, m := range ms {
			if string(m.Body) == "bad" {
				failed[i] = ferry.Permanent(errors.New("not a row"))
				continue
			}
			stored = append(stored, string(m.Body))
		}
		if len(stored) == 3 {
			close(done)
		}
		if len(failed) > 0 {
			return &ferry.BatchError{Failed: failed} // only "bad" fails (to the dead-letter topic)
		}
		return nil
	}), 64)
	c, _ := b.NewConsumer("loader", "rows", h, ferry.WithStartFrom(ferry.Earliest))
	_ = c.Start(ctx)
	defer c.Close()
	<-done
	mu.Lock()
	fmt.Println(stored)
	mu.Unlock()
	// Output: [a b c]
}

// A handler under a time limit: long work says it is still going.
func ExampleInProgress() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 1})
	done := make(chan error, 1)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		for range 6 { // 60 ms of work under a 30 ms limit
			time.Sleep(10 * time.Millisecond)
			if err := ferry.InProgress(ctx); err != nil {
				done <- err
				return err
			}
		}
		done <- nil
		return nil
	})
	c, _ := b.NewConsumer("workers", "jobs", h, ferry.WithHandlerTimeout(30*time.Millisecond))
	_ = c.Start(ctx)
	defer c.Close()
	p, _ := b.NewProducer()
	defer p.Close()
	_, _ = p.Send(ctx, &ferry.Message{Topic: "jobs", Body: []byte("report")})
	fmt.Println("finished:", <-done == nil)
	// Output: finished: true
}

// One consumer over two topics; the handler tells them apart by Topic.
func ExampleBroker_NewMultiConsumer() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2})
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "refunds", Queues: 1})
	var mu sync.Mutex
	var seen []string
	got := make(chan struct{}, 2)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		mu.Lock()
		seen = append(seen, m.Topic+": "+string(m.Body))
		mu.Unlock()
		got <- struct{}{}
		return nil
	})
	c, _ := b.NewMultiConsumer("billing", []string{"orders", "refunds"}, h, ferry.WithRateLimit(100, 10))
	_ = c.Start(ctx)
	defer c.Close()
	p, _ := b.NewProducer()
	defer p.Close()
	_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("#1")})
	_, _ = p.Send(ctx, &ferry.Message{Topic: "refunds", Body: []byte("#7")})
	<-got
	<-got
	mu.Lock()
	slices.Sort(seen)
	fmt.Println(seen)
	mu.Unlock()
	fmt.Println(c.Topics())
	// Output:
	// [orders: #1 refunds: #7]
	// [orders refunds]
}

// A Transactional handler's sends are stored only when it succeeds: the
// first attempt here fails after sending, and only the second one's
// invoice is stored.
func ExampleTransactional() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "invoices", Queues: 1})
	p, _ := b.NewProducer()
	defer p.Close()
	_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("order 1")})

	c, _ := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		body := fmt.Sprintf("invoice for %s (attempt %d)", m.Body, d.Attempt)
		if err := ferry.OutboxFrom(ctx).Send(&ferry.Message{Topic: "invoices", Body: []byte(body)}); err != nil {
			return err
		}
		if d.Attempt == 1 {
			return errors.New("the database is down") // nothing sent is stored
		}
		return nil
	}), ferry.Transactional(), ferry.WithRetry(3, time.Millisecond))
	_ = c.Start(ctx)
	defer c.Close()

	got := make(chan string, 2)
	r, _ := b.NewConsumer("reader", "invoices", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		got <- string(m.Body)
		return nil
	}))
	_ = r.Start(ctx)
	defer r.Close()
	fmt.Println(<-got)
	select {
	case s := <-got:
		fmt.Println("and", s)
	case <-time.After(50 * time.Millisecond):
	}
	// Output: invoice for order 1 (attempt 2)
}
