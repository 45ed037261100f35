package filestore_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// A broker over a Store keeps its topics, messages and cursors across a
// restart.
func ExampleOpen() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "filestore-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// First run: create a topic, send, commit a cursor.
	st, err := filestore.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		log.Fatal(err)
	}
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "events", Queues: 1}); err != nil {
		log.Fatal(err)
	}
	p, _ := b.NewProducer()
	for _, body := range []string{"a", "b", "c"} {
		if _, err := p.Send(ctx, &ferry.Message{Topic: "events", Body: []byte(body)}); err != nil {
			log.Fatal(err)
		}
	}
	_ = st.Commit(ctx, "events", "g", 0, 1) // "a" is consumed
	_ = p.Close()
	_ = b.Close()
	_ = st.Close()

	// Second run: the same directory.
	st, err = filestore.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	b, err = ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	cursor, _ := st.Load(ctx, "events", "g", 1)
	q, _ := b.Queue("events", 0)
	_, next := q.Offsets()
	buf := make([]*ferry.EnhancedMessage, 10)
	n, _ := q.Read(ctx, cursor[0], buf)
	fmt.Println("next offset:", next, "cursor:", cursor[0])
	for _, m := range buf[:n] {
		fmt.Printf("%d %s\n", m.Offset, m.Body)
	}
	// Output:
	// next offset: 3 cursor: 1
	// 1 b
	// 2 c
}
