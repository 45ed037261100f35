package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// A message due in three hours, tested in milliseconds: the broker runs
// its delays on a fake clock, which the test advances.
func ExampleMessage_deliverAt() {
	ctx := context.Background()
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC))
	b, _ := ferry.NewBroker(ferry.WithClock(clock))
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "reservations", Queues: 1})

	got := make(chan string)
	c, _ := b.NewConsumer("expiry", "reservations", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		got <- fmt.Sprintf("%s at %s", m.Body, clock.Now().Format("15:04"))
		return nil
	}))
	_ = c.Start(ctx)
	defer c.Close()

	p, _ := b.NewProducer()
	res, _ := p.Send(ctx, &ferry.Message{Topic: "reservations", Body: []byte("expire r-42"), DeliverAt: clock.Now().Add(3 * time.Hour)})
	fmt.Println("waits in a delay topic:", ferry.IsDelayTopic(res.Queue.Topic), "then goes to", res.Target)

	_ = clock.WaitForTimers(ctx, 1) // the delay level waits on the clock
	clock.Advance(3 * time.Hour)
	fmt.Println(<-got)
	// Output:
	// waits in a delay topic: true then goes to reservations[0]
	// expire r-42 at 18:00
}

// A handler asks for a retry in ten minutes, whatever the backoff: in
// concurrent mode the message waits in the group's retry topic, and the
// queue flows on meanwhile.
func ExampleRetryAfter() {
	ctx := context.Background()
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC))
	b, _ := ferry.NewBroker(ferry.WithClock(clock))
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "charges", Queues: 1})

	done := make(chan struct{})
	c, _ := b.NewConsumer("billing", "charges", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		fmt.Printf("%s: attempt %d at %s\n", m.Body, d.Attempt, clock.Now().Format("15:04"))
		if d.Attempt == 1 {
			return ferry.RetryAfter(errors.New("card processor busy"), 10*time.Minute)
		}
		close(done)
		return nil
	}))
	_ = c.Start(ctx)
	defer c.Close()

	p, _ := b.NewProducer()
	_, _ = p.Send(ctx, &ferry.Message{Topic: "charges", Body: []byte("charge c-7")})
	for {
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond):
			clock.AdvanceToNext()
		}
	}
	// Output:
	// charge c-7: attempt 1 at 15:00
	// charge c-7: attempt 2 at 15:10
}
