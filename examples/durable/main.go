// Durable sends orders to a topic stored on disk and consumes half of
// them with a pull consumer, committing as it goes; then it stops, starts
// again from the same directory, and a new consumer of the same group
// resumes from the committed cursor: topics, messages and cursors survive
// the restart.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

const (
	topic = "orders"
	group = "billing"
)

func main() {
	dir, err := os.MkdirTemp("", "ferry-durable-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	fmt.Println("== first run: send 6 orders, consume 3")
	if err := run(dir, func(ctx context.Context, b *ferry.Broker) error {
		if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: topic, Queues: 1}); err != nil {
			return err
		}
		p, err := b.NewProducer()
		if err != nil {
			return err
		}
		defer p.Close()
		for i := range 6 {
			res, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: fmt.Appendf(nil, "order %d", i)})
			if err != nil {
				return err
			}
			fmt.Printf("sent %q -> %s offset %d\n", fmt.Sprintf("order %d", i), res.Queue, res.Offset)
		}
		return consume(ctx, b, 3)
	}); err != nil {
		log.Fatal(err)
	}

	fmt.Println("== second run: the same directory, the same group")
	if err := run(dir, func(ctx context.Context, b *ferry.Broker) error {
		meta, ok := b.Topic(topic)
		if !ok {
			return errors.New("topic lost")
		}
		q, err := b.Queue(topic, 0)
		if err != nil {
			return err
		}
		oldest, next := q.Offsets()
		fmt.Printf("topic %s is back: %d queue, offsets [%d, %d)\n", meta.Name, meta.Queues, oldest, next)
		return consume(ctx, b, 3)
	}); err != nil {
		log.Fatal(err)
	}
}

// run opens the store and a broker over it, calls f, and closes both: the
// broker first, then the store.
func run(dir string, f func(context.Context, *ferry.Broker) error) error {
	st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncAlways))
	if err != nil {
		return err
	}
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		return errors.Join(err, st.Close())
	}
	err = f(context.Background(), b)
	return errors.Join(err, b.Close(), st.Close())
}

// consume polls n messages as a member of the group and commits each one
// once handled; the cursor it leaves is where the next member starts.
func consume(ctx context.Context, b *ferry.Broker, n int) error {
	c, err := b.NewPullConsumer(group, topic, ferry.WithStartFrom(ferry.Earliest))
	if err != nil {
		return err
	}
	defer c.Close()
	for n > 0 {
		msgs, err := c.Poll(ctx, n)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			fmt.Printf("consumed %q from %s offset %d\n", m.Body, m.QueueID(), m.Offset)
			if err := c.Commit(ctx, m); err != nil {
				return err
			}
		}
		n -= len(msgs)
	}
	return nil
}
