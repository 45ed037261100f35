package ferryotel

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is a [ferry.Hook] that traces sends, handler calls and dead
// letters (see the package doc for the spans and their attributes).
// Register it on the broker ([ferry.WithHooks]) so the consumers'
// dead-letter sends are traced too. It is safe for concurrent use, and
// holds no goroutine.
type Tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	fields     []string // the propagator's header names
	link       bool

	// sending holds the recording send spans between OnSend and OnSent,
	// by the message the producer passes to both.
	sending sync.Map // *ferry.EnhancedMessage → trace.Span
}

var (
	_ ferry.HookSend         = (*Tracing)(nil)
	_ ferry.HookSent         = (*Tracing)(nil)
	_ ferry.HookHandle       = (*Tracing)(nil)
	_ ferry.HookHandled      = (*Tracing)(nil)
	_ ferry.HookDeadLettered = (*Tracing)(nil)
)

// NewTracing returns a tracing hook configured by opts.
func NewTracing(opts ...TracingOption) *Tracing {
	var c tracingConfig
	for _, o := range opts {
		o(&c)
	}
	c.defaults()
	return &Tracing{
		tracer:     c.provider.Tracer(ScopeName),
		propagator: c.propagator,
		fields:     c.propagator.Fields(),
		link:       c.link,
	}
}

// OnSend starts the send span of em: a child of the span in ctx or,
// when ctx has none, of the trace context em's headers carry (a dead
// letter carries its original's, so its send joins the original's
// trace). It gives em a copy of its headers with the span's context in
// them; a span that is not recorded and propagates nothing leaves em as
// it is.
func (t *Tracing) OnSend(ctx context.Context, em *ferry.EnhancedMessage) {
	parent := ctx
	if !trace.SpanContextFromContext(ctx).IsValid() && len(em.Headers) > 0 {
		parent = t.propagator.Extract(ctx, propagation.MapCarrier(em.Headers))
	}
	attrs := make([]attribute.KeyValue, 0, 14)
	attrs = append(attrs,
		systemAttr,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationNameKey.String(opSend),
		semconv.MessagingDestinationNameKey.String(em.Topic),
		partition(em.Queue),
		semconv.MessagingMessageIDKey.String(em.ID.String()),
		semconv.MessagingMessageBodySizeKey.Int(len(em.Body)),
	)
	attrs = keyTag(attrs, &em.Message)
	if origin := em.Headers[ferry.HeaderOriginTopic]; origin != "" {
		attrs = append(attrs, OriginTopicKey.String(origin),
			OriginPartitionKey.String(em.Headers[ferry.HeaderOriginQueue]),
			semconv.MessagingConsumerGroupNameKey.String(em.Headers[ferry.HeaderGroup]))
		if off, err := strconv.ParseInt(em.Headers[ferry.HeaderOriginOffset], 10, 64); err == nil {
			attrs = append(attrs, OriginOffsetKey.Int64(off))
		}
		if n, err := strconv.Atoi(em.Headers[ferry.HeaderAttempts]); err == nil {
			attrs = append(attrs, DeadLetterAttemptsKey.Int(n))
		}
	}
	ctx, span := t.tracer.Start(parent, opSend+" "+em.Topic,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	t.inject(ctx, em)
	if span.IsRecording() {
		t.sending.Store(em, span)
	}
}

// inject puts the trace context of ctx in a copy of em's headers, first
// taking out what the propagator's fields held (a dead letter's copy of
// its original's context, say). Nothing to inject leaves em alone.
func (t *Tracing) inject(ctx context.Context, em *ferry.EnhancedMessage) {
	out := propagation.MapCarrier{}
	t.propagator.Inject(ctx, out)
	if len(out) == 0 {
		return
	}
	h := make(map[string]string, len(em.Headers)+len(out))
	maps.Copy(h, em.Headers)
	for _, f := range t.fields {
		delete(h, f)
	}
	maps.Copy(h, out)
	em.Headers = h
}

// OnSent ends em's send span: with its offset, or with err.
func (t *Tracing) OnSent(_ context.Context, em *ferry.EnhancedMessage, err error) {
	v, ok := t.sending.LoadAndDelete(em)
	if !ok {
		return
	}
	span := v.(trace.Span)
	if err != nil {
		endError(span, err)
		return
	}
	span.SetAttributes(OffsetKey.Int64(em.Offset))
	span.End()
}

// endSpan ends span, with err if not nil.
func endSpan(span trace.Span, err error) {
	if err == nil {
		span.End()
		return
	}
	endError(span, err)
}

// endError ends span with err.
func endError(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(errorType(err))
	span.End()
}

// processSpanKey keys the process span in the handler's context: another
// hook after this one may put a span of its own there.
type processSpanKey struct{}

// OnHandle starts the process span of one handler call of m, from the
// trace context in m's headers (its parent, or its link with
// [WithLinkedProcess]), and returns ctx with the span, so that the
// handler's spans are its children.
func (t *Tracing) OnHandle(ctx context.Context, m *ferry.EnhancedMessage) context.Context {
	d, _ := ferry.DeliveryFrom(ctx)
	ctx, span := t.startProcess(ctx, m, d)
	if !span.IsRecording() {
		return ctx
	}
	return context.WithValue(ctx, processSpanKey{}, span)
}

// StartProcess starts the process span of m for code that handles
// messages outside a push consumer, which has no hook for it: a
// [ferry.PullConsumer]'s loop, say. group names the consumer group. It
// returns ctx with the span and the function that ends it, with the
// handling's error (nil: success); call it once.
func (t *Tracing) StartProcess(ctx context.Context, group string, m *ferry.EnhancedMessage) (context.Context, func(error)) {
	ctx, span := t.startProcess(ctx, m, ferry.Delivery{Group: group})
	return ctx, func(err error) { endSpan(span, err) }
}

func (t *Tracing) startProcess(ctx context.Context, m *ferry.EnhancedMessage, d ferry.Delivery) (context.Context, trace.Span) {
	attrs := make([]attribute.KeyValue, 0, 15)
	attrs = append(attrs,
		systemAttr,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationNameKey.String(opProcess),
		semconv.MessagingDestinationNameKey.String(m.Topic),
		partition(m.Queue),
		semconv.MessagingConsumerGroupNameKey.String(d.Group),
		semconv.MessagingMessageIDKey.String(m.ID.String()),
		semconv.MessagingMessageBodySizeKey.Int(len(m.Body)),
		OffsetKey.Int64(m.Offset),
	)
	if d.Attempt > 0 {
		attrs = append(attrs, AttemptKey.Int(d.Attempt), MaxAttemptsKey.Int(d.MaxAttempts), MemberKey.String(d.Member))
	}
	attrs = keyTag(attrs, &m.Message)
	parent, opts := t.fromHeaders(ctx, m)
	opts = append(opts, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return t.tracer.Start(parent, opProcess+" "+m.Topic, opts...)
}

// fromHeaders returns the parent context and start options of a span
// about m: a child of the context m's headers carry, or linked to it.
func (t *Tracing) fromHeaders(ctx context.Context, m *ferry.EnhancedMessage) (context.Context, []trace.SpanStartOption) {
	if len(m.Headers) == 0 {
		return ctx, nil
	}
	carrier := propagation.MapCarrier(m.Headers)
	if !t.link {
		return t.propagator.Extract(ctx, carrier), nil
	}
	sc := trace.SpanContextFromContext(t.propagator.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		return ctx, nil
	}
	return ctx, []trace.SpanStartOption{trace.WithLinks(trace.Link{SpanContext: sc})}
}

// OnHandled ends the process span OnHandle started: with err, if the
// handler failed.
func (t *Tracing) OnHandled(ctx context.Context, _ *ferry.EnhancedMessage, _ time.Duration, err error) {
	if span, ok := ctx.Value(processSpanKey{}).(trace.Span); ok {
		endSpan(span, err)
	}
}

// OnDeadLettered records the dead letter of m as a span of its own,
// "dead_letter <topic>" (messaging.operation.type settle), beside m's
// process spans: where the dead letter went, after how many attempts,
// and the handler's last error as an exception event. The span's status
// is unset: the dead letter went; the failed process spans carry the
// error status.
func (t *Tracing) OnDeadLettered(m *ferry.EnhancedMessage, dl ferry.SendResult, attempts int, cause error) {
	parent, opts := t.fromHeaders(context.Background(), m)
	opts = append(opts, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		systemAttr,
		semconv.MessagingOperationTypeSettle,
		semconv.MessagingOperationNameKey.String(opDeadLetter),
		semconv.MessagingDestinationNameKey.String(m.Topic),
		partition(m.Queue),
		semconv.MessagingMessageIDKey.String(m.ID.String()),
		OffsetKey.Int64(m.Offset),
		DeadLetterAttemptsKey.Int(attempts),
		DeadLetterTopicKey.String(dl.Queue.Topic),
		DeadLetterPartitionKey.String(strconv.Itoa(dl.Queue.Queue)),
		DeadLetterOffsetKey.Int64(dl.Offset),
	))
	_, span := t.tracer.Start(parent, opDeadLetter+" "+m.Topic, opts...)
	if cause != nil {
		span.RecordError(cause)
	}
	span.End()
}
