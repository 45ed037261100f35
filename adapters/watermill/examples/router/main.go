// Command router runs a Watermill Router with middleware over Ferry: a
// handler reserves stock for each order (failing now and then, retried by
// the Retry middleware, a panic turned into a Nack by Recoverer) and
// publishes a shipment; a second handler consumes the shipments. The
// correlation ID of each order follows it to its shipment. Orders are keyed
// by customer, so each customer's orders are handled in order. It stops on
// its own once every order is shipped.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ferrymq/ferry"
	ferrywm "github.com/ferrymq/ferry/adapters/watermill"
)

const orders = 20

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	b, err := ferry.NewBroker()
	if err != nil {
		return err
	}
	defer b.Close()
	pub, err := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{Queues: 4})
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "shipping"})
	if err != nil {
		return err
	}
	defer sub.Close()

	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(
		middleware.CorrelationID,
		middleware.Retry{MaxRetries: 5, InitialInterval: time.Millisecond, Logger: logger}.Middleware,
		middleware.Recoverer,
	)

	router.AddHandler("reserve", "orders", sub, "shipments", pub,
		func(msg *message.Message) ([]*message.Message, error) {
			switch rand.IntN(6) {
			case 0:
				return nil, errors.New("stock service busy") // retried by Retry
			case 1:
				panic("stock service crashed") // Recoverer: an error, retried too
			}
			out := message.NewMessage(watermill.NewUUID(), []byte("shipment for "+string(msg.Payload)))
			out.Metadata.Set(ferrywm.DefaultKeyMetadata, msg.Metadata.Get(ferrywm.DefaultKeyMetadata))
			return []*message.Message{out}, nil
		})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shipped := 0
	router.AddConsumerHandler("ship", "shipments", sub, func(msg *message.Message) error {
		shipped++ // one subscription: one message at a time
		fmt.Printf("%-28s customer %-4s correlation %s\n", msg.Payload,
			msg.Metadata.Get(ferrywm.DefaultKeyMetadata), middleware.MessageCorrelationID(msg))
		if shipped == orders {
			cancel()
		}
		return nil
	})

	customers := []string{"ada", "bob", "cyd", "dee"}
	for i := range orders {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%02d", i+1))
		msg.Metadata.Set(ferrywm.DefaultKeyMetadata, customers[i%len(customers)])
		middleware.SetCorrelationID(fmt.Sprintf("req-%02d", i+1), msg)
		if err := pub.Publish("orders", msg); err != nil {
			return err
		}
	}
	if err := router.Run(ctx); err != nil {
		return err
	}
	if shipped != orders {
		return fmt.Errorf("shipped %d of %d orders", shipped, orders)
	}
	fmt.Printf("all %d orders shipped\n", orders)
	return nil
}
