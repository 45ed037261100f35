package ferryotel_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferry"
	ferryotel "github.com/ferrymq/ferry/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The life of one message: sent, failed twice, dead-lettered, the dead
// letter read by another group. Every span is in the trace the send
// started.
func ExampleNewTracing() {
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)
	tracing := ferryotel.NewTracing(ferryotel.WithTracerProvider(tp), ferryotel.WithPropagator(propagation.TraceContext{}))

	b, _ := ferry.NewBroker(ferry.WithHooks(tracing)) // on the broker: dead-letter sends are traced too
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})

	audited := make(chan struct{})
	c, _ := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		_, span := tp.Tracer("billing").Start(ctx, "charge") // nests in the process span
		defer span.End()
		return errors.New("card declined")
	}), ferry.WithRetry(2, time.Millisecond))
	_ = c.Start(ctx)
	a, _ := b.NewConsumer("audit", "%DLQ%billing", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		close(audited)
		return nil
	}))
	_ = a.Start(ctx)

	p, _ := b.NewProducer()
	_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Key: "alice", Body: []byte("order 1")})
	<-audited
	_ = a.Close() // its handler's span ends before Close returns
	_ = c.Close()

	printTree(rec.Ended())
	// Output:
	// send orders (producer) offset=0
	//   process orders (consumer) attempt=1 error="card declined"
	//     charge (internal)
	//   process orders (consumer) attempt=2 error="card declined"
	//     charge (internal)
	//   send %DLQ%billing (producer) offset=0
	//     process %DLQ%billing (consumer) attempt=1
	//   dead_letter orders (internal) attempts=2
}

// printTree prints spans as a tree, children in the order they started.
func printTree(spans []sdktrace.ReadOnlySpan) {
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
	}
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		kids := children[parent]
		slices.SortFunc(kids, func(a, b sdktrace.ReadOnlySpan) int {
			return cmp.Or(a.StartTime().Compare(b.StartTime()), cmp.Compare(a.Name(), b.Name()))
		})
		for _, s := range kids {
			line := fmt.Sprintf("%s%s (%s)", strings.Repeat("  ", depth), s.Name(), s.SpanKind())
			for _, kv := range s.Attributes() {
				switch {
				case s.SpanKind() == trace.SpanKindProducer && kv.Key == ferryotel.OffsetKey,
					s.SpanKind() == trace.SpanKindConsumer && kv.Key == ferryotel.AttemptKey,
					s.SpanKind() == trace.SpanKindInternal && kv.Key == ferryotel.DeadLetterAttemptsKey:
					line += fmt.Sprintf(" %s=%s", shortKey(kv.Key), kv.Value.String())
				}
			}
			if s.Status().Description != "" {
				line += fmt.Sprintf(" error=%q", s.Status().Description)
			}
			fmt.Println(line)
			walk(s.SpanContext().SpanID(), depth+1)
		}
	}
	walk(trace.SpanID{}, 0)
}

func shortKey(k attribute.Key) string { return string(k)[strings.LastIndex(string(k), ".")+1:] }
