package ferryotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and the meter
// this package gets from its providers.
const ScopeName = "github.com/ferrymq/ferry/otel"

// TracingOption configures [NewTracing].
type TracingOption func(*tracingConfig)

type tracingConfig struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
	link       bool
}

// WithTracerProvider sets the provider of the tracer. Default: the global
// one, [otel.GetTracerProvider], read when [NewTracing] runs.
func WithTracerProvider(tp trace.TracerProvider) TracingOption {
	return func(c *tracingConfig) { c.provider = tp }
}

// WithPropagator sets how trace context goes into and comes out of
// message headers. Default: the global one, [otel.GetTextMapPropagator],
// read when [NewTracing] runs; if that propagates nothing (the global
// default is a no-op), W3C trace context and baggage
// ([propagation.TraceContext], [propagation.Baggage]).
func WithPropagator(p propagation.TextMapPropagator) TracingOption {
	return func(c *tracingConfig) { c.propagator = p }
}

// WithLinkedProcess makes each process span (and dead-letter span) link
// to the send span of its message instead of being its child: the
// process span's parent is then whatever span the handler's context
// already carries (usually none, so it starts a trace of its own). Use it
// when one trace per producer request would grow too large. Default: the
// process span is a child of the send span.
func WithLinkedProcess() TracingOption {
	return func(c *tracingConfig) { c.link = true }
}

func (c *tracingConfig) defaults() {
	if c.provider == nil {
		c.provider = otel.GetTracerProvider()
	}
	if c.propagator == nil {
		c.propagator = otel.GetTextMapPropagator()
		if len(c.propagator.Fields()) == 0 {
			c.propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		}
	}
}

// MetricsOption configures [NewMetrics].
type MetricsOption func(*metricsConfig)

type metricsConfig struct {
	provider metric.MeterProvider
}

// WithMeterProvider sets the provider of the meter. Default: the global
// one, [otel.GetMeterProvider], read when [NewMetrics] runs.
func WithMeterProvider(mp metric.MeterProvider) MetricsOption {
	return func(c *metricsConfig) { c.provider = mp }
}

func (c *metricsConfig) defaults() {
	if c.provider == nil {
		c.provider = otel.GetMeterProvider()
	}
}
