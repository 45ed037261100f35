package filestore_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// A Store's queue is a durable append-only log on its own, for a broker
// of your own: no ferry.Broker involved. Write stamps offsets, Read reads
// from any retained offset, and the log is there after a reopen.
func ExampleStore_OpenQueue() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "filestore-queue-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	meta := ferry.TopicMeta{Name: "ledger", Queues: 2}

	st, err := filestore.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	q, err := st.OpenQueue(ctx, meta, 1)
	if err != nil {
		log.Fatal(err)
	}
	var batch []*ferry.EnhancedMessage
	for _, body := range []string{"credit 10", "debit 3", "credit 5"} {
		batch = append(batch, &ferry.EnhancedMessage{Message: ferry.Message{Topic: "ledger", Body: []byte(body)}})
	}
	first, err := q.Write(ctx, batch) // all or nothing
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first offset", first, "last", batch[2].Offset)
	_ = q.Close()
	_ = st.Close()

	// Reopened: the log is as it was.
	st, err = filestore.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	q, err = st.OpenQueue(ctx, meta, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	oldest, next := q.Offsets()
	fmt.Println("offsets", oldest, next)
	dst := make([]*ferry.EnhancedMessage, 8)
	n, err := q.Read(ctx, 1, dst) // from offset 1
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range dst[:n] {
		fmt.Println(m.Offset, string(m.Body))
	}
	// Output:
	// first offset 0 last 2
	// offsets 0 3
	// 1 debit 3
	// 2 credit 5
}
