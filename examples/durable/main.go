// Durable sends messages to a topic stored on disk, consumes a few and
// commits the cursor, stops, starts again from the same directory and
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

	fmt.Println("== first run: send 6, consume 2 per queue")
	if err := run(dir, func(ctx context.Context, b *ferry.Broker, st *filestore.Store) error {
		if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: topic, Queues: 2}); err != nil {
			return err
		}
		p, err := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
		if err != nil {
			return err
		}
		defer p.Close()
		for i := range 6 {
			res, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: fmt.Appendf(nil, "order %d", i)})
			if err != nil {
				return err
			}
			fmt.Printf("sent order %d -> %s offset %d\n", i, res.Queue, res.Offset)
		}
		return consume(ctx, b, st, 2)
	}); err != nil {
		log.Fatal(err)
	}

	fmt.Println("== second run: resume from the committed cursors")
	if err := run(dir, func(ctx context.Context, b *ferry.Broker, st *filestore.Store) error {
		meta, ok := b.Topic(topic)
		if !ok {
			return errors.New("topic lost")
		}
		fmt.Printf("topic %s with %d queues is back\n", meta.Name, meta.Queues)
		return consume(ctx, b, st, -1)
	}); err != nil {
		log.Fatal(err)
	}
}

// run opens the store and a broker over it, calls f, and closes both.
func run(dir string, f func(context.Context, *ferry.Broker, *filestore.Store) error) error {
	st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncAlways))
	if err != nil {
		return err
	}
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		return errors.Join(err, st.Close())
	}
	err = f(context.Background(), b, st)
	return errors.Join(err, b.Close(), st.Close())
}

// consume reads up to max messages (all when max < 0) of each queue from
// the group's cursor on, then commits the next offset.
func consume(ctx context.Context, b *ferry.Broker, cs ferry.CursorStore, max int) error {
	meta, _ := b.Topic(topic)
	cursors, err := cs.Load(ctx, topic, group, meta.Queues)
	if err != nil {
		return err
	}
	for i, from := range cursors {
		q, err := b.Queue(topic, i)
		if err != nil {
			return err
		}
		oldest, next := q.Offsets()
		if from < 0 {
			from = oldest // nothing committed yet: start at the beginning
		}
		if max >= 0 {
			next = min(next, from+int64(max))
		}
		for off := from; off < next; {
			buf := make([]*ferry.EnhancedMessage, next-off)
			n, err := q.Read(ctx, off, buf)
			if err != nil {
				return err
			}
			for _, m := range buf[:n] {
				fmt.Printf("consumed %s from %s offset %d\n", m.Body, m.QueueID(), m.Offset)
			}
			off += int64(n)
		}
		if err := cs.Commit(ctx, topic, group, i, next); err != nil {
			return err
		}
		fmt.Printf("committed %s[%d] at %d\n", topic, i, next)
	}
	return nil
}
