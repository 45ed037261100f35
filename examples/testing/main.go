// Testing shows how to test code that publishes with Ferry: an order
// service that retries a failed publish once, driven over a fake storage
// from package ferrytest that fails the second write, as a full disk
// would. The program prints what the service returned and what reached
// the queue: every order exactly once, in order, despite the failure.
//
// In a test, ferrytest.NewFakeBroker(t) replaces the set-up of run.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// OrderService publishes an event per order placed, retrying once.
type OrderService struct {
	Producer *ferry.Producer
}

// PlaceOrder publishes that customer placed order id. A failed publish is
// retried once; Ferry's writes are all or nothing, so a retry cannot
// duplicate the event.
func (s *OrderService) PlaceOrder(ctx context.Context, id, customer string) error {
	m := &ferry.Message{Topic: "orders", Key: customer, Tag: "placed", Body: []byte(id)}
	_, err := s.Producer.Send(ctx, m)
	if err != nil && !errors.Is(err, ferry.ErrClosed) {
		// Send must not be given the same Message twice: it keeps it.
		retry := *m
		_, err = s.Producer.Send(ctx, &retry)
	}
	if err != nil {
		return fmt.Errorf("place order %s: %w", id, err)
	}
	return nil
}

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run places three orders while the storage fails its second write, then
// prints every write attempt and what was published.
func run(ctx context.Context, out io.Writer) error {
	storage := ferrytest.NewFakeStorage()
	defer storage.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(storage))
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2}); err != nil {
		return err
	}
	p, err := b.NewProducer(ferry.WithProducerName("order-service"))
	if err != nil {
		return err
	}
	defer p.Close()
	svc := &OrderService{Producer: p}

	errDiskFull := errors.New("disk full")
	storage.FailNth(2, errDiskFull) // the 2nd write to any queue of the storage

	for _, o := range []struct{ id, customer string }{{"A-1", "alice"}, {"B-1", "bob"}, {"A-2", "alice"}} {
		if err := svc.PlaceOrder(ctx, o.id, o.customer); err != nil {
			return err
		}
		fmt.Fprintf(out, "placed %s for %s\n", o.id, o.customer)
	}
	fmt.Fprintln(out, "write attempts:")
	for _, w := range storage.Writes() {
		status := "ok"
		if w.Err != nil {
			status = "failed: " + w.Err.Error()
		}
		fmt.Fprintf(out, "  %s %s: %s\n", w.Queue, w.Messages[0].Body, status)
	}
	fmt.Fprintln(out, "published:")
	for _, m := range storage.Messages("orders") {
		fmt.Fprintf(out, "  %s offset %d: %s %s (key %s)\n", m.QueueID(), m.Offset, m.Tag, m.Body, m.Key)
	}
	return nil
}
