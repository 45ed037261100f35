package ferryotel_test

import (
	"context"
	"testing"

	"github.com/ferrymq/ferry"
	ferryotel "github.com/ferrymq/ferry/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkSend is a Send's cost with no hook, and with each hook.
func BenchmarkSend(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	metrics, err := ferryotel.NewMetrics(ferryotel.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		hooks []ferry.Hook
	}{
		{"none", nil},
		{"metrics", []ferry.Hook{metrics}},
		{"tracing-noop", []ferry.Hook{ferryotel.NewTracing(ferryotel.WithTracerProvider(noop.NewTracerProvider()))}},
		{"tracing-sampled", []ferry.Hook{ferryotel.NewTracing(ferryotel.WithTracerProvider(tp))}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			br, err := ferry.NewBroker(ferry.WithHooks(bc.hooks...))
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1,
				Retention: ferry.Retention{MaxMessages: 1024}}); err != nil {
				b.Fatal(err)
			}
			p, _ := br.NewProducer()
			m := &ferry.Message{Topic: "t", Body: []byte("0123456789")}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Send(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
