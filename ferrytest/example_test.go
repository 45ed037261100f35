package ferrytest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// OrderService is the code a user wants to test: it publishes an event
// for every order placed.
type OrderService struct {
	Producer *ferry.Producer
}

// PlaceOrder publishes that customer placed order id.
func (s *OrderService) PlaceOrder(ctx context.Context, id, customer string) error {
	_, err := s.Producer.Send(ctx, &ferry.Message{Topic: "orders", Key: customer, Tag: "placed", Body: []byte(id)})
	if err != nil {
		return fmt.Errorf("place order %s: %w", id, err)
	}
	return nil
}

// Example_orderService tests an order service's publishing against a
// FakeQueue: the second write fails as a full disk would, and the test
// sees the error the service returns and exactly what was published. In a
// test function, ferrytest.NewFakeBroker(t) does the set-up in one line.
func Example_orderService() {
	ctx := context.Background()
	storage := ferrytest.NewFakeStorage()
	defer storage.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(storage))
	if err != nil {
		panic(err)
	}
	defer b.Close()
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}); err != nil {
		panic(err)
	}
	p, err := b.NewProducer()
	if err != nil {
		panic(err)
	}
	svc := &OrderService{Producer: p}

	errDiskFull := errors.New("disk full")
	queue := storage.Queue("orders", 0)
	queue.FailNth(2, errDiskFull)

	for _, id := range []string{"A-1", "A-2", "A-3"} {
		if err := svc.PlaceOrder(ctx, id, "alice"); err != nil {
			fmt.Println("error:", err, "| disk full:", errors.Is(err, errDiskFull))
		}
	}
	for _, w := range queue.Writes() {
		fmt.Printf("write of %s: first offset %d, error %v\n", w.Messages[0].Body, w.First, w.Err != nil)
	}
	for _, m := range queue.Messages() {
		fmt.Printf("published at %d: %s %s by %s\n", m.Offset, m.Tag, m.Body, m.Key)
	}
	// Output:
	// error: place order A-2: ferry: send: ferrytest: write orders[0] (call 2): disk full | disk full: true
	// write of A-1: first offset 0, error false
	// write of A-2: first offset -1, error true
	// write of A-3: first offset 1, error false
	// published at 0: placed A-1 by alice
	// published at 1: placed A-3 by alice
}

// ExampleFakeCoordinator expires a member's session as a distributed
// coordinator would when the member goes silent: its lease is lost
// before the member waiting for the queue gets it, with a larger token,
// and the others are told.
func ExampleFakeCoordinator() {
	ctx := context.Background()
	c := ferrytest.NewFakeCoordinator()
	defer c.Close()
	g := ferry.GroupKey{Scope: "billing", Topic: "orders"}

	a, _ := c.Join(ctx, g, "node-a")
	b, _ := c.Join(ctx, g, "node-b")
	lease, _ := a.Lock(ctx, 0)
	member, first, _ := c.Holder(g, 0)
	fmt.Println("queue 0 held by", member, "with the lease's token:", first == lease.Token())

	got := make(chan ferry.Lease)
	go func() {
		l, _ := b.Lock(ctx, 0) // waits for node-a
		got <- l
	}()
	c.Expire(g, "node-a")
	next := <-got
	lost := false
	select {
	case <-lease.Lost(): // closed before node-b's Lock returned
		lost = true
	default:
	}
	<-a.Done()
	member, token, _ := c.Holder(g, 0)
	fmt.Println("queue 0 held by", member, "with a larger token:", token > first && token == next.Token(), "| node-a's lease lost:", lost)
	<-b.Changed()
	fmt.Println("node-b sees", b.Members())
	for _, s := range c.Sessions() {
		fmt.Println("session", s.Group, s.Member, "holding", s.Queues)
	}
	// Output:
	// queue 0 held by node-a with the lease's token: true
	// queue 0 held by node-b with a larger token: true | node-a's lease lost: true
	// node-b sees [node-b]
	// session billing/orders node-b holding [0]
}
