package natsstore_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// A broker over NATS: topics, messages, cursors and the consumer group
// live in JetStream, so brokers in other processes over the same account
// (and prefix) share them.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "natsstore-example")
	defer os.RemoveAll(dir)
	srv, _ := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	srv.Start()
	defer srv.Shutdown()
	srv.ReadyForConnections(5 * time.Second)

	ctx := context.Background()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := natsstore.Open(ctx, js, natsstore.WithPrefix("example"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	co, err := natsstore.NewCoordinator(ctx, js, natsstore.WithPrefix("example"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer co.Close()
	b, _ := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	defer b.Close()

	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2})
	got := make(chan string)
	c, _ := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		got <- string(m.Body)
		return nil
	}))
	defer c.Close()
	_ = c.Start(ctx)
	p, _ := b.NewProducer()
	defer p.Close()
	if _, err := p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("hello over NATS")}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-got)
	// Output: hello over NATS
}
