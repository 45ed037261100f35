package ferry_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// BenchmarkRebalanceUnderLoad times a member joining a group that owns
// 256 queues while its 20 workers run CPU-bound handlers on a full
// backlog: one op is one join, until the joiner holds its queues.
func BenchmarkRebalanceUnderLoad(b *testing.B) {
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 256}); err != nil {
		b.Fatal(err)
	}
	p, err := br.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
	if err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // keep every queue's backlog full
		body := make([]byte, 100)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = p.Send(ctx, &ferry.Message{Topic: "t", Body: body})
		}
	}()
	var sink atomic.Int64
	spin := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		x := int64(0)
		for i := range 20000 { // ~10-20 µs of CPU
			x += int64(i) * int64(i)
		}
		sink.Add(x)
		return nil
	})
	owner, err := br.NewConsumer("g", "t", spin, ferry.WithMemberID("m2"), ferry.WithConcurrency(20))
	if err != nil {
		b.Fatal(err)
	}
	if err := owner.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer owner.Close()
	time.Sleep(200 * time.Millisecond) // let the backlog and the workers get busy
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		joiner, err := br.NewConsumer("g", "t", spin, ferry.WithMemberID("m1-"+strconv.Itoa(i)), ferry.WithConcurrency(20))
		if err != nil {
			b.Fatal(err)
		}
		if err := joiner.Start(ctx); err != nil { // m1-* sorts first: it takes half of the queues from m2
			b.Fatal(err)
		}
		b.StopTimer()
		_ = joiner.Close()
		b.StartTimer()
	}
}
