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
