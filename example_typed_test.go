package ferry_test

import (
	"context"
	"fmt"

	"github.com/ferrymq/ferry"
)

// Order is the value the typed examples send.
type Order struct {
	Customer string  `json:"customer"`
	Total    float64 `json:"total"`
}

// A typed producer sends Orders (as JSON, the default codec) and a typed
// handler gets them back, with the message for its key and headers.
func ExampleTypedHandler() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	p, _ := b.NewProducer()
	defer p.Close()
	orders, _ := ferry.NewTypedProducer[Order](p)

	got := make(chan string, 3)
	c, _ := b.NewConsumer("billing", "orders", ferry.TypedHandler(
		func(ctx context.Context, o Order, m *ferry.EnhancedMessage) error {
			got <- fmt.Sprintf("%s: %s %.2f (%s)", m.Key, o.Customer, o.Total, m.Headers["source"])
			return nil
		}), ferry.Ordered()) // one at a time, in order: for the output
	_ = c.Start(ctx)
	defer c.Close()

	for _, o := range []Order{{"alice", 12.5}, {"bob", 3}} {
		_, err := orders.Send(ctx, &ferry.TypedMessage[Order]{
			Topic: "orders", Key: o.Customer, Headers: map[string]string{"source": "web"}, Value: o,
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(<-got)
	fmt.Println(<-got)
	// Output:
	// alice: alice 12.50 (web)
	// bob: bob 3.00 (web)
}

// A typed pull consumer hands out a message whose body is not an Order
// with its decode error, for the caller to deal with; the loop goes on.
func ExampleTypedPullConsumer() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	p, _ := b.NewProducer()
	defer p.Close()
	for _, body := range []string{`{"customer":"alice","total":12.5}`, `{"customer":`} {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte(body)})
	}

	pc, _ := b.NewPullConsumer("audit", "orders")
	defer pc.Close()
	orders, _ := ferry.NewTypedPullConsumer[Order](pc)
	n := 0
	for r, err := range orders.Messages(ctx) {
		if err != nil && r.Msg == nil {
			fmt.Println(err) // ctx done or consumer closed: the loop ends
			return
		}
		if err != nil {
			fmt.Printf("offset %d: not an order: %q\n", r.Msg.Offset, r.Msg.Body)
		} else {
			fmt.Printf("offset %d: %s %.2f\n", r.Msg.Offset, r.Value.Customer, r.Value.Total)
		}
		_ = orders.Commit(ctx, r) // decoded or not
		if n++; n == 2 {
			break
		}
	}
	// Output:
	// offset 0: alice 12.50
	// offset 1: not an order: "{\"customer\":"
}
