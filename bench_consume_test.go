package ferry_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferry"
)

// BenchmarkConsume measures one producer to one consumer, end to end:
// b.N messages sent and handled, ns/op and allocs/op per message.
func BenchmarkConsume(b *testing.B) {
	for _, bc := range []struct {
		name  string
		batch int
		ret   ferry.Retention
	}{
		{"Send", 1, ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}},
		{"SendBlock", 1, ferry.Retention{MaxMessages: 1 << 16, Overflow: ferry.Block}}, // ferrybench W1's bounded case
		{"SendBatch64", 64, ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}},
		{"SendBatch64Block", 64, ferry.Retention{MaxMessages: 1 << 14, Overflow: ferry.Block}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			br, err := ferry.NewBroker()
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1, Retention: bc.ret}); err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			all := make(chan struct{})
			want := int64(b.N)
			c, err := br.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
				if n.Add(1) == want {
					close(all)
				}
				return nil
			}), ferry.WithConcurrency(1))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			p, _ := br.NewProducer()
			body := []byte("0123456789abcdef0123456789abcdef")
			msgs := make([]*ferry.Message, bc.batch)
			for i := range msgs {
				msgs[i] = &ferry.Message{Topic: "t", Body: body}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for sent := 0; sent < b.N; {
				k := min(bc.batch, b.N-sent)
				if k == 1 {
					_, err = p.Send(ctx, msgs[0])
				} else {
					_, err = p.SendBatch(ctx, msgs[:k])
				}
				if err != nil {
					b.Fatal(err)
				}
				sent += k
			}
			<-all
		})
	}
}

// BenchmarkConsumeOnly measures the consumer path alone: the queue is
// filled before the timer starts, then one consumer handles b.N messages.
func BenchmarkConsumeOnly(b *testing.B) {
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}); err != nil {
		b.Fatal(err)
	}
	p, _ := br.NewProducer()
	msgs := make([]*ferry.Message, 1024)
	for i := range msgs {
		msgs[i] = &ferry.Message{Topic: "t", Body: []byte("0123456789abcdef0123456789abcdef")}
	}
	for sent := 0; sent < b.N; sent += len(msgs) {
		if _, err := p.SendBatch(ctx, msgs[:min(len(msgs), b.N-sent)]); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	all := make(chan struct{})
	want := int64(b.N)
	c, err := br.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		if n.Add(1) == want {
			close(all)
		}
		return nil
	}), ferry.WithConcurrency(1))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-all
	b.StopTimer()
	_ = c.Close()
}

// BenchmarkChannelBaseline is the yardstick: a buffered Go channel handing
// message pointers from one goroutine to another.
func BenchmarkChannelBaseline(b *testing.B) {
	ch := make(chan *ferry.EnhancedMessage, 1024)
	done := make(chan struct{})
	go func() {
		for range b.N {
			<-ch
		}
		close(done)
	}()
	m := &ferry.EnhancedMessage{}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		ch <- m
	}
	<-done
}
