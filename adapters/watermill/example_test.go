package ferrywm_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ferrymq/ferry"
	ferrywm "github.com/ferrymq/ferry/adapters/watermill"
)

// A Watermill Router with middleware consumes orders from Ferry, publishes
// a shipment per order back to Ferry, and a second handler consumes the
// shipments. The correlation ID travels from order to shipment; a
// transient failure is retried by the Retry middleware; a panic would be
// turned into a Nack by Recoverer, and Ferry would deliver the order again.
func Example_router() {
	b, _ := ferry.NewBroker()
	defer b.Close()
	pub, _ := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{})
	defer pub.Close()
	sub, _ := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "shipping"})
	defer sub.Close()

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(
		middleware.CorrelationID,
		middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware,
		middleware.Recoverer,
	)

	var once sync.Once
	router.AddHandler("reserve", "orders", sub, "shipments", pub,
		func(msg *message.Message) ([]*message.Message, error) {
			failed := false
			once.Do(func() { failed = true })
			if failed {
				return nil, errors.New("stock service busy") // Retry tries again
			}
			out := message.NewMessage(watermill.NewUUID(), []byte("ship "+string(msg.Payload)))
			out.Metadata.Set(ferrywm.DefaultKeyMetadata, msg.Metadata.Get(ferrywm.DefaultKeyMetadata))
			return []*message.Message{out}, nil // CorrelationID copies the ID onto out
		})

	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var shipped []string
	router.AddConsumerHandler("ship", "shipments", sub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		shipped = append(shipped, fmt.Sprintf("%s (correlation %s)", msg.Payload, middleware.MessageCorrelationID(msg)))
		if len(shipped) == 3 {
			cancel() // stops the router
		}
		return nil
	})

	for i, customer := range []string{"ada", "bob", "cyd"} {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%d", i+1))
		msg.Metadata.Set(ferrywm.DefaultKeyMetadata, customer) // per-customer order
		middleware.SetCorrelationID(fmt.Sprintf("req-%d", i+1), msg)
		if err := pub.Publish("orders", msg); err != nil {
			fmt.Println(err)
		}
	}

	if err := router.Run(ctx); err != nil { // returns once ctx is cancelled and handlers stopped
		fmt.Println(err)
	}
	slices.Sort(shipped)
	for _, s := range shipped {
		fmt.Println(s)
	}
	// Output:
	// ship order-1 (correlation req-1)
	// ship order-2 (correlation req-2)
	// ship order-3 (correlation req-3)
}
