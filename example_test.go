package ferry_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferrymq/ferry"
)

func ExampleProducer_Send() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4})
	p, _ := b.NewProducer()
	defer p.Close()

	for _, customer := range []string{"alice", "bob", "alice"} {
		res, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: customer, Body: []byte("order")})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(customer, "->", res.Queue, "offset", res.Offset)
	}
	// Output:
	// alice -> orders[1] offset 0
	// bob -> orders[2] offset 0
	// alice -> orders[1] offset 1
}

func ExampleProducer_SendBatch() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "events", Queues: 2})
	p, _ := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
	defer p.Close()

	batch := []*ferry.Message{{Topic: "events"}, {Topic: "events"}, {Topic: "events"}}
	results, err := p.SendBatch(ctx, batch) // one Write per queue
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range results {
		fmt.Println(r.Queue, r.Offset)
	}
	// Output:
	// events[0] 0
	// events[1] 0
	// events[0] 1
}

func ExampleProducer_SendAsync() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	p, _ := b.NewProducer(ferry.WithMaxInFlight(100))
	defer p.Close()

	var offsets []int64 // callbacks of one queue run one at a time, in send order
	for range 3 {
		err := p.SendAsync(ctx, &ferry.Message{Topic: "orders", Body: []byte("order")}, func(res ferry.SendResult, err error) {
			if err != nil {
				fmt.Println("not stored:", err)
				return
			}
			offsets = append(offsets, res.Offset)
		})
		if err != nil { // bad input: nothing sent, no callback
			fmt.Println(err)
			return
		}
	}
	if err := p.Flush(ctx); err != nil { // every callback has returned
		fmt.Println(err)
		return
	}
	fmt.Println(offsets)
	// Output:
	// [0 1 2]
}

func ExampleBroker_CreateTopic() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()

	fmt.Println(b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4}))
	fmt.Println(b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4})) // idempotent
	err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 8})
	fmt.Println(errors.Is(err, ferry.ErrTopicExists))
	err = b.CreateTopic(ctx, ferry.TopicMeta{Name: "../etc", Queues: 1})
	fmt.Println(errors.Is(err, ferry.ErrInvalidTopic))
	// Output:
	// <nil>
	// <nil>
	// true
	// true
}

func ExampleKeyHashRouter() {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "t", Queues: 12}
	// The partition Kafka's Java client picks for key "foobar" of 12.
	i, _ := r.Select(&ferry.EnhancedMessage{Message: ferry.Message{Key: "foobar"}}, meta)
	fmt.Println(i)
	// Output: 6
}

func ExampleProducer_TrySend() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 1,
		Retention: ferry.Retention{MaxMessages: 1, Overflow: ferry.Block}})
	p, _ := b.NewProducer()
	_, err := p.TrySend(&ferry.Message{Topic: "jobs"})
	fmt.Println(err)
	_, err = p.TrySend(&ferry.Message{Topic: "jobs"})
	fmt.Println(errors.Is(err, ferry.ErrQueueFull))
	// Output:
	// <nil>
	// true
}
