// Quickstart creates a topic of 4 queues, starts a consumer group of two
// members that split the queues, a broadcast consumer and an ordered
// consumer, sends keyed messages (printing where each landed: equal keys
// share a queue) and checks that every message arrived where it should.
package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync"

	"github.com/ferrymq/ferry"
)

// counter counts the messages a consumer handled, by member.
type counter struct {
	mu    sync.Mutex
	n     map[string]int
	total int
	want  int
	done  chan struct{}
}

func newCounter(want int) *counter {
	return &counter{n: map[string]int{}, want: want, done: make(chan struct{})}
}

func (c *counter) add(member string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[member]++
	c.total++
	if c.total == c.want {
		close(c.done)
	}
}

func (c *counter) handler(member string) ferry.Handler {
	return ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		c.add(member)
		return nil
	})
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func main() {
	ctx := context.Background()
	b, err := ferry.NewBroker()
	must(err)
	defer b.Close() // closes the consumers too

	must(b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4}))

	customers := []string{"alice", "bob", "carol", "alice", "dave", "bob"}
	const rounds = 10
	total := len(customers) * rounds

	// A group of two members: each queue has exactly one owner.
	billing := newCounter(total)
	var group []*ferry.Consumer
	for _, id := range []string{"billing-1", "billing-2"} {
		c, err := b.NewConsumer("billing", "orders", billing.handler(id), ferry.WithMemberID(id))
		must(err)
		must(c.Start(ctx))
		group = append(group, c)
	}
	for _, c := range group {
		fmt.Printf("group billing: %s owns %v\n", c.MemberID(), c.Assigned())
	}

	// A broadcast member gets every queue.
	audit := newCounter(total)
	a, err := b.NewConsumer("audit", "orders", audit.handler("auditor"), ferry.Broadcast(), ferry.WithMemberID("auditor"))
	must(err)
	must(a.Start(ctx))
	fmt.Printf("broadcast audit: %s owns %v\n", a.MemberID(), a.Assigned())

	// An ordered consumer sees each customer's orders in the order sent.
	shipping := newCounter(total)
	var mu sync.Mutex
	next := map[string]int{} // customer -> next order number expected
	outOfOrder := 0
	s, err := b.NewConsumer("shipping", "orders", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		var n int
		var who string
		if _, err := fmt.Sscanf(string(m.Body), "order %d of %s", &n, &who); err != nil {
			return ferry.Permanent(err)
		}
		mu.Lock()
		if n < next[who] {
			outOfOrder++
		}
		next[who] = n
		mu.Unlock()
		shipping.add("shipping")
		return nil
	}), ferry.Ordered())
	must(err)
	must(s.Start(ctx))

	p, err := b.NewProducer(ferry.WithProducerName("quickstart"))
	must(err)
	defer p.Close()
	for r := range rounds {
		for i, customer := range customers {
			n := r*len(customers) + i
			res, err := p.Send(ctx, &ferry.Message{
				Topic: "orders",
				Key:   customer,
				Body:  fmt.Appendf(nil, "order %d of %s", n, customer),
			})
			must(err)
			if r == 0 {
				fmt.Printf("order %d of %-5s -> %s offset %d\n", n, customer, res.Queue, res.Offset)
			}
		}
	}

	<-billing.done
	<-audit.done
	<-shipping.done
	fmt.Printf("billing handled %d of %d orders (billing-1: %d, billing-2: %d)\n",
		billing.total, total, billing.n["billing-1"], billing.n["billing-2"])
	fmt.Printf("audit handled %d of %d orders\n", audit.total, total)
	fmt.Printf("shipping handled %d of %d orders, %d out of order per customer\n", shipping.total, total, outOfOrder)
	if billing.total == total && audit.total == total && shipping.total == total && outOfOrder == 0 {
		fmt.Println("every message arrived:", strings.Join([]string{"billing", "audit", "shipping"}, ", "))
	}
}
