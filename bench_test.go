package ferry_test

import (
	"context"
	"testing"

	"github.com/ferrymq/ferry"
)

var benchBody = make([]byte, 100)

func BenchmarkSend(b *testing.B) {
	ctx := context.Background()
	br := newBroker(b, 1)
	p := newProducer(b, br)
	m := &ferry.Message{Topic: "orders", Body: benchBody}
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		if _, err := p.Send(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSendKeyed(b *testing.B) {
	ctx := context.Background()
	br := newBroker(b, 8)
	p := newProducer(b, br)
	m := &ferry.Message{Topic: "orders", Key: "customer-42", Body: benchBody}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Send(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSendParallel(b *testing.B) {
	ctx := context.Background()
	br := newBroker(b, 8)
	p := newProducer(b, br)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		m := &ferry.Message{Topic: "orders", Body: benchBody}
		for pb.Next() {
			if _, err := p.Send(ctx, m); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkSendBatch sends batches of 100 messages; ns/op and allocs/op are
// per batch, msgs/s is reported.
func BenchmarkSendBatch(b *testing.B) {
	ctx := context.Background()
	br := newBroker(b, 1)
	p := newProducer(b, br)
	batch := make([]*ferry.Message, 100)
	for i := range batch {
		batch[i] = &ferry.Message{Topic: "orders", Body: benchBody}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.SendBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msgs/s")
}
