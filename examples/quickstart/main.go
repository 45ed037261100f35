// Quickstart creates a topic of 4 queues, sends keyed messages and prints
// where each landed: equal keys share a queue.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/ferrymq/ferry"
)

func main() {
	ctx := context.Background()
	b, err := ferry.NewBroker()
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4}); err != nil {
		log.Fatal(err)
	}
	p, err := b.NewProducer(ferry.WithProducerName("quickstart"))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	for i, customer := range []string{"alice", "bob", "carol", "alice", "dave", "bob"} {
		res, err := p.Send(ctx, &ferry.Message{
			Topic: "orders",
			Key:   customer,
			Body:  fmt.Appendf(nil, "order %d of %s", i, customer),
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("order %d of %-5s -> %s offset %d (id %s)\n", i, customer, res.Queue, res.Offset, res.ID)
	}
}
