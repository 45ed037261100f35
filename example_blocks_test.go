package ferry_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// The examples in this file use Ferry's building blocks alone, without a
// Broker, as a broker of your own would.

// A Router picks the partition of a record of another system: here a
// system whose records carry a tenant, routed by the key hash Kafka's
// clients use, so the same tenant lands on the same partition there and
// here.
func ExampleRouter() {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "audit", Queues: 8} // the foreign topic's shape
	type record struct{ tenant, action string }
	for _, rec := range []record{{"acme", "login"}, {"globex", "login"}, {"acme", "logout"}} {
		i, err := r.Select(&ferry.EnhancedMessage{Message: ferry.Message{Key: rec.tenant}}, meta)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s %s -> partition %d\n", rec.tenant, rec.action, i)
	}
	// A router of your own is a function.
	byAction := ferry.RouterFunc(func(m *ferry.EnhancedMessage, meta ferry.TopicMeta) (int, error) {
		if m.Tag == "logout" {
			return meta.Queues - 1, nil
		}
		return 0, nil
	})
	i, _ := byAction.Select(&ferry.EnhancedMessage{Message: ferry.Message{Tag: "logout"}}, meta)
	fmt.Println("logout ->", i)
	// Output:
	// acme login -> partition 4
	// globex login -> partition 7
	// acme logout -> partition 4
	// logout -> 7
}

// An Allocator splits the partitions of another system among its
// workers: each worker runs it with the same inputs and gets its own
// share, and the shares never overlap.
func ExampleAllocator() {
	var parts []ferry.QueueID
	for i := range 8 {
		parts = append(parts, ferry.QueueID{Topic: "shards", Queue: i})
	}
	workers := []string{"worker-a", "worker-b", "worker-c"}
	for _, a := range []struct {
		name string
		a    ferry.Allocator
	}{{"averagely", ferry.AllocateAveragely()}, {"by circle", ferry.AllocateAveragelyByCircle()}} {
		fmt.Println(a.name)
		for _, w := range workers {
			var own []int
			for _, q := range a.a.Allocate("indexers", w, parts, workers) {
				own = append(own, q.Queue)
			}
			fmt.Println(" ", w, own)
		}
	}
	// Output:
	// averagely
	//   worker-a [0 1 2]
	//   worker-b [3 4 5]
	//   worker-c [6 7]
	// by circle
	//   worker-a [0 3 6]
	//   worker-b [1 4 7]
	//   worker-c [2 5]
}

// A Buffer sits between a fetch loop of your own and its handlers: Put
// takes fetched messages until the high watermark or the max span stops
// it, Done finishes them in any order, and Committable is the offset to
// save.
func ExampleBuffer() {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "jobs"}, ferry.Retention{})
	defer q.Close()
	for i := range 10 {
		if _, err := q.Write(ctx, []*ferry.EnhancedMessage{{Message: ferry.Message{Body: fmt.Appendf(nil, "job-%d", i)}}}); err != nil {
			log.Fatal(err)
		}
	}
	buf, err := ferry.NewBuffer(ferry.BufferConfig{MaxMessages: 4, HighWatermark: 1, LowWatermark: 0.5, MaxSpan: 5})
	if err != nil {
		log.Fatal(err)
	}
	// fetch reads from the buffer's next offset and puts what fits; a
	// done ctx makes Put return at once instead of waiting for room.
	fetch := func() {
		scratch := make([]*ferry.EnhancedMessage, 10)
		n, err := q.Read(ctx, buf.Next(), scratch)
		if err != nil {
			log.Fatal(err)
		}
		now, cancel := context.WithCancel(ctx)
		cancel()
		put, err := buf.Put(now, scratch[:n])
		fmt.Printf("fetched %d, put %d (%v), next %d, paused %v\n", n, put, err, buf.Next(), buf.Stats().Paused)
	}
	taken := make([]*ferry.EnhancedMessage, 4)
	take := func() {
		n, _ := buf.Take(taken)
		fmt.Println("took", n)
	}
	fetch() // the high watermark, 4 messages: offsets 0-3
	take()
	buf.Done(taken[1]) // out of order: 0 is unfinished
	fmt.Println("committable", buf.Committable())
	fetch() // 3 unfinished, above the low watermark (2): still paused
	buf.Done(taken[2])
	fetch() // down to the low watermark: 4 (5 is MaxSpan past 0, unfinished)
	buf.Done(taken[0], taken[3])
	fmt.Println("committable", buf.Committable())
	// Output:
	// fetched 10, put 4 (<nil>), next 4, paused true
	// took 4
	// committable 0
	// fetched 6, put 0 (ferry: buffer put: context canceled), next 4, paused true
	// fetched 6, put 1 (<nil>), next 5, paused true
	// committable 4
}

// The codec is Ferry's encoding of a message, for storing or sending it
// in a system of your own; it keeps every field.
func Example_codec() {
	m := &ferry.EnhancedMessage{
		Message:       ferry.Message{Topic: "orders", Key: "customer-42", Tag: "created", Headers: map[string]string{"trace": "abc"}, Body: []byte(`{"total":12}`)},
		ID:            ferry.NewMessageID(time.Unix(1700000000, 0)),
		Queue:         3,
		Offset:        1207,
		StoreUnixNano: time.Unix(1700000001, 0).UnixNano(),
	}
	b := codec.Append(nil, m)
	fmt.Println(len(b) == codec.Size(m), b[0] == codec.Version)
	got, n, err := codec.Decode(b)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n == len(b), got.Topic, got.Key, got.Tag, got.Headers["trace"], string(got.Body), got.Queue, got.Offset, got.ID == m.ID)
	// A cut encoding is an error, never a message.
	_, _, err = codec.Decode(b[:len(b)-1])
	fmt.Println(err != nil)
	// Output:
	// true true
	// true orders customer-42 created abc {"total":12} 3 1207 true
	// true
}
