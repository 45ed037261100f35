package remote_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/examples/remote"
	"github.com/ferrymq/ferry/filestore"
)

// A broker whose queues and cursors are on a server: here the server runs
// in the same process, on loopback; cmd/ferry-remote runs one of its own.
func ExampleNewStorage() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "remote-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The server: a filestore served over HTTP/2.
	fs, err := filestore.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer fs.Close()
	srv, err := remote.NewServer(fs)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()

	// The client: an unmodified broker over the remote storage.
	st, err := remote.NewStorage(l.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2}); err != nil {
		log.Fatal(err)
	}
	p, _ := b.NewProducer()
	res, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "customer-42", Body: []byte("two pizzas")})
	if err != nil {
		log.Fatal(err)
	}
	got := make(chan string, 1)
	c, err := b.NewConsumer("kitchen", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		got <- fmt.Sprintf("%s at %s offset %d", m.Body, m.QueueID(), m.Offset)
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("sent to", res.Queue, "offset", res.Offset)
	fmt.Println("handled", <-got)
	// Output:
	// sent to orders[1] offset 0
	// handled two pizzas at orders[1] offset 0
}
