package ferry_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferry"
)

// BenchmarkTyped measures one producer to one consumer, end to end, per
// message: bytes sent and handled (the body an Order's JSON, not decoded),
// the same with json.Marshal and json.Unmarshal written by hand around
// Send and in the handler, and TypedProducer with TypedHandler
// (JSONCodec). The second is the floor of the third: what is left is the
// wrappers' own cost.
func BenchmarkTyped(b *testing.B) {
	o := Order{Customer: "alice", Total: 12.5}
	body, _ := json.Marshal(o)
	for _, mode := range []string{"Bytes", "BytesManualJSON", "TypedJSON"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			br, err := ferry.NewBroker()
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1,
				Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}); err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			all := make(chan struct{})
			want := int64(b.N)
			count := func() {
				if n.Add(1) == want {
					close(all)
				}
			}
			var h ferry.Handler
			switch mode {
			case "Bytes":
				h = ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { count(); return nil })
			case "BytesManualJSON":
				h = ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
					var v Order
					if err := json.Unmarshal(m.Body, &v); err != nil {
						return ferry.Permanent(err)
					}
					count()
					return nil
				})
			default:
				h = ferry.TypedHandler(func(context.Context, Order, *ferry.EnhancedMessage) error { count(); return nil })
			}
			c, err := br.NewConsumer("g", "t", h, ferry.WithConcurrency(1))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			p, _ := br.NewProducer()
			defer p.Close()
			tp, _ := ferry.NewTypedProducer[Order](p)
			tm := &ferry.TypedMessage[Order]{Topic: "t", Value: o}
			m := &ferry.Message{Topic: "t", Body: body}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				switch mode {
				case "Bytes":
					_, err = p.Send(ctx, m)
				case "BytesManualJSON":
					var enc []byte
					if enc, err = json.Marshal(o); err == nil {
						_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: enc})
					}
				default:
					_, err = tp.Send(ctx, tm)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			<-all
		})
	}
}

// BenchmarkTypedHandle measures the decoding side alone, no broker: a
// TypedHandler's Handle of one message against json.Unmarshal by hand
// in a HandlerFunc, to isolate what the wrapper adds to the codec.
func BenchmarkTypedHandle(b *testing.B) {
	body, _ := json.Marshal(Order{Customer: "alice", Total: 12.5})
	m := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: body}}
	ctx := context.Background()
	for name, h := range map[string]ferry.Handler{
		"ManualJSON": ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
			var v Order
			return json.Unmarshal(m.Body, &v)
		}),
		"TypedJSON": ferry.TypedHandler(func(context.Context, Order, *ferry.EnhancedMessage) error { return nil }),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := h.Handle(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
