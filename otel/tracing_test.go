package ferryotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	ferryotel "github.com/ferrymq/ferry/otel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// deadLetters is a hook that tells when a dead letter went: registered
// after the tracing hook, it runs once that hook is done with it.
type deadLetters chan ferry.SendResult

func (d deadLetters) OnDeadLettered(_ *ferry.EnhancedMessage, dl ferry.SendResult, _ int, _ error) {
	d <- dl
}

// headersSeen is a hook that records the headers of each message written.
type headersSeen chan map[string]string

func (h headersSeen) OnSent(_ context.Context, em *ferry.EnhancedMessage, err error) {
	if err == nil {
		h <- em.Headers
	}
}

func newTracer(t *testing.T, opts ...ferryotel.TracingOption) (*ferryotel.Tracing, *tracetest.SpanRecorder, trace.Tracer) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts = append([]ferryotel.TracingOption{ferryotel.WithTracerProvider(tp), ferryotel.WithPropagator(propagation.TraceContext{})}, opts...)
	return ferryotel.NewTracing(opts...), rec, tp.Tracer("test")
}

// lifeRun sends one message under a span "request", has group g fail it
// on both attempts (each handler call making a span "work") so it is
// dead-lettered, and consumes the dead letter in group "audit". It
// returns when the dead letter was handled.
func lifeRun(t *testing.T, hooks ...ferry.Hook) {
	t.Helper()
	ctx := context.Background()
	var tracer trace.Tracer
	for _, h := range hooks {
		if tr, ok := h.(trace.Tracer); ok {
			tracer = tr
		}
	}
	b, err := ferry.NewBroker(ferry.WithHooks(hooks...))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2}))

	dead := make(deadLetters, 1)
	c, err := b.NewConsumer("g", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		if tracer != nil {
			_, span := tracer.Start(ctx, "work")
			span.End()
		}
		return errors.New("boom")
	}), ferry.WithRetry(2, 0), ferry.WithConsumerHooks(dead))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()

	audited := make(chan struct{}, 1)
	a, err := b.NewConsumer("audit", "%DLQ%g", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		audited <- struct{}{}
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, a.Start(ctx))
	defer a.Close()

	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	headers := map[string]string{"k": "v"}
	sctx := ctx
	if tracer != nil {
		var span trace.Span
		sctx, span = tracer.Start(ctx, "request")
		defer span.End()
	}
	_, err = p.Send(sctx, &ferry.Message{Topic: "orders", Key: "alice", Headers: headers, Body: []byte("order")})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"k": "v"}, headers, "the sender's headers are not changed")
	wait(t, dead, "dead letter")
	wait(t, audited, "dead letter handled")
}

// tracerHook is a tracing hook that is also the test's tracer, for
// lifeRun to find.
type tracerHook struct {
	*ferryotel.Tracing
	trace.Tracer
}

// spanTree indexes ended spans.
type spanTree struct {
	byName map[string][]sdktrace.ReadOnlySpan
}

func newSpanTree(spans []sdktrace.ReadOnlySpan) spanTree {
	st := spanTree{byName: map[string][]sdktrace.ReadOnlySpan{}}
	for _, s := range spans {
		st.byName[s.Name()] = append(st.byName[s.Name()], s)
	}
	return st
}

func (st spanTree) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	require.Len(t, st.byName[name], 1, "spans named %q", name)
	return st.byName[name][0]
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func TestTracingMessageLife(t *testing.T) {
	tr, rec, tracer := newTracer(t)
	lifeRun(t, tracerHook{tr, tracer})

	st := newSpanTree(rec.Ended())
	request := st.one(t, "request")
	send := st.one(t, "send orders")
	assert.Equal(t, trace.SpanKindProducer, send.SpanKind())
	assert.Equal(t, request.SpanContext().SpanID(), send.Parent().SpanID(), "send is a child of the sender's span")
	assert.Equal(t, "ferry", attrOf(send, "messaging.system").AsString())
	assert.Equal(t, "orders", attrOf(send, "messaging.destination.name").AsString())
	assert.Equal(t, "send", attrOf(send, "messaging.operation.type").AsString())
	assert.Equal(t, "alice", attrOf(send, "ferry.message.key").AsString())
	assert.Equal(t, int64(0), attrOf(send, ferryotel.OffsetKey).AsInt64())
	assert.NotEmpty(t, attrOf(send, "messaging.message.id").AsString())
	queue := attrOf(send, "messaging.destination.partition.id").AsString()
	traceID := request.SpanContext().TraceID()

	process := st.byName["process orders"]
	require.Len(t, process, 2, "one process span per attempt")
	for i, p := range process {
		assert.Equal(t, trace.SpanKindConsumer, p.SpanKind())
		assert.Equal(t, traceID, p.SpanContext().TraceID())
		assert.Equal(t, send.SpanContext().SpanID(), p.Parent().SpanID(), "process is a child of send, through the headers")
		assert.True(t, p.Parent().IsRemote())
		assert.Equal(t, int64(i+1), attrOf(p, ferryotel.AttemptKey).AsInt64())
		assert.Equal(t, int64(2), attrOf(p, ferryotel.MaxAttemptsKey).AsInt64())
		assert.Equal(t, "g", attrOf(p, "messaging.consumer.group.name").AsString())
		assert.Equal(t, "process", attrOf(p, "messaging.operation.type").AsString())
		assert.Equal(t, queue, attrOf(p, "messaging.destination.partition.id").AsString())
		assert.Equal(t, codes.Error, p.Status().Code)
		assert.Equal(t, "boom", p.Status().Description)
		assert.Equal(t, "*errors.errorString", attrOf(p, "error.type").AsString())
	}
	work := st.byName["work"]
	require.Len(t, work, 2)
	assert.ElementsMatch(t,
		[]trace.SpanID{process[0].SpanContext().SpanID(), process[1].SpanContext().SpanID()},
		[]trace.SpanID{work[0].Parent().SpanID(), work[1].Parent().SpanID()},
		"the handler's spans nest in the process spans")

	dlSend := st.one(t, "send %DLQ%g")
	assert.Equal(t, trace.SpanKindProducer, dlSend.SpanKind())
	assert.Equal(t, send.SpanContext().SpanID(), dlSend.Parent().SpanID(), "the dead letter's send continues the message's trace")
	assert.Equal(t, "orders", attrOf(dlSend, ferryotel.OriginTopicKey).AsString())
	assert.Equal(t, queue, attrOf(dlSend, ferryotel.OriginPartitionKey).AsString())
	assert.Equal(t, int64(0), attrOf(dlSend, ferryotel.OriginOffsetKey).AsInt64())
	assert.Equal(t, int64(2), attrOf(dlSend, ferryotel.DeadLetterAttemptsKey).AsInt64())
	assert.Equal(t, "g", attrOf(dlSend, "messaging.consumer.group.name").AsString())

	dl := st.one(t, "dead_letter orders")
	assert.Equal(t, send.SpanContext().SpanID(), dl.Parent().SpanID())
	assert.Equal(t, "settle", attrOf(dl, "messaging.operation.type").AsString())
	assert.Equal(t, "%DLQ%g", attrOf(dl, ferryotel.DeadLetterTopicKey).AsString())
	assert.Equal(t, int64(2), attrOf(dl, ferryotel.DeadLetterAttemptsKey).AsInt64())
	require.Len(t, dl.Events(), 1)
	assert.Equal(t, "exception", dl.Events()[0].Name)

	audit := st.one(t, "process %DLQ%g")
	assert.Equal(t, dlSend.SpanContext().SpanID(), audit.Parent().SpanID(), "the dead letter's reader is a child of its send")
	assert.Equal(t, codes.Unset, audit.Status().Code)
	assert.Equal(t, traceID, audit.SpanContext().TraceID())

	assert.Len(t, rec.Ended(), 9, "request, send, 2 process, 2 work, dead-letter send and span, audit process")
	assert.Len(t, rec.Started(), len(rec.Ended()), "every span started ended")
}

func TestTracingLinkedProcess(t *testing.T) {
	tr, rec, tracer := newTracer(t, ferryotel.WithLinkedProcess())
	lifeRun(t, tracerHook{tr, tracer})

	st := newSpanTree(rec.Ended())
	send := st.one(t, "send orders")
	for _, p := range st.byName["process orders"] {
		assert.False(t, p.Parent().IsValid(), "a linked process span starts a trace")
		assert.NotEqual(t, send.SpanContext().TraceID(), p.SpanContext().TraceID())
		require.Len(t, p.Links(), 1)
		assert.Equal(t, send.SpanContext().SpanID(), p.Links()[0].SpanContext.SpanID())
	}
	dl := st.one(t, "dead_letter orders")
	require.Len(t, dl.Links(), 1)
	assert.Equal(t, send.SpanContext().SpanID(), dl.Links()[0].SpanContext.SpanID())
}

// A failed send ends its span with the error.
func TestTracingSendError(t *testing.T) {
	tr, rec, _ := newTracer(t)
	ctx := context.Background()
	b, err := ferry.NewBroker(ferry.WithHooks(tr))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 1,
		Retention: ferry.Retention{MaxMessages: 1, Overflow: ferry.Block}}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	_, err = p.TrySend(&ferry.Message{Topic: "jobs"})
	require.NoError(t, err)
	_, err = p.TrySend(&ferry.Message{Topic: "jobs"})
	require.ErrorIs(t, err, ferry.ErrQueueFull)
	_, err = p.Send(ctx, &ferry.Message{Topic: "nope"})
	require.ErrorIs(t, err, ferry.ErrTopicNotFound)

	spans := rec.Ended()
	require.Len(t, spans, 2, "a message refused before it is stamped has no span")
	assert.Equal(t, codes.Unset, spans[0].Status().Code)
	assert.Equal(t, codes.Error, spans[1].Status().Code)
	assert.Equal(t, "ferry.ErrQueueFull", attrOf(spans[1], "error.type").AsString())
	assert.Len(t, rec.Started(), 2)
}

// A batch has a span per message, each message its own context.
func TestTracingBatch(t *testing.T) {
	tr, rec, _ := newTracer(t)
	ctx := context.Background()
	seen := make(headersSeen, 3)
	b, err := ferry.NewBroker(ferry.WithHooks(tr, seen))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "a", Queues: 2}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "b", Queues: 1}))
	p, err := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
	require.NoError(t, err)
	_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "a"}, {Topic: "b"}, {Topic: "a"}})
	require.NoError(t, err)
	spans := rec.Ended()
	require.Len(t, spans, 3)
	parents := map[string]bool{}
	for range 3 {
		h := wait(t, seen, "headers")
		parents[h["traceparent"]] = true
	}
	assert.Len(t, parents, 3, "each message carries its own span")
	for _, s := range spans {
		assert.Contains(t, parents, "00-"+s.SpanContext().TraceID().String()+"-"+s.SpanContext().SpanID().String()+"-01")
	}
}

// With a tracer that records nothing and no context to propagate, a send
// leaves the message's headers alone.
func TestTracingNoopLeavesHeaders(t *testing.T) {
	tr := ferryotel.NewTracing(ferryotel.WithTracerProvider(noop.NewTracerProvider()))
	ctx := context.Background()
	seen := make(headersSeen, 1)
	b, err := ferry.NewBroker(ferry.WithHooks(tr, seen))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "a", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "a"})
	require.NoError(t, err)
	assert.Nil(t, wait(t, seen, "headers"))
}

// A pull consumer's loop makes its process spans with StartProcess.
func TestTracingStartProcessPull(t *testing.T) {
	tr, rec, _ := newTracer(t)
	ctx := context.Background()
	b, err := ferry.NewBroker(ferry.WithHooks(tr))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "a", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "a", Tag: "t1"})
	require.NoError(t, err)

	pc, err := b.NewPullConsumer("puller", "a")
	require.NoError(t, err)
	defer pc.Close()
	msgs, err := pc.Poll(ctx, 1)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	_, end := tr.StartProcess(ctx, "puller", msgs[0])
	end(errors.New("bad"))
	require.NoError(t, pc.Commit(ctx, msgs...))

	st := newSpanTree(rec.Ended())
	send, process := st.one(t, "send a"), st.one(t, "process a")
	assert.Equal(t, send.SpanContext().SpanID(), process.Parent().SpanID())
	assert.Equal(t, "puller", attrOf(process, "messaging.consumer.group.name").AsString())
	assert.Equal(t, "t1", attrOf(process, ferryotel.TagKey).AsString())
	assert.Equal(t, codes.Error, process.Status().Code)
	assert.Equal(t, attribute.EMPTY, attrOf(process, ferryotel.AttemptKey).Type(), "a pull delivery has no attempt count")
}

// wrapper is a hook after the tracing one that puts a span of its own in
// the handler's context: the tracing hook still ends its own span.
type wrapper struct{ tracer trace.Tracer }

func (w wrapper) OnHandle(ctx context.Context, _ *ferry.EnhancedMessage) context.Context {
	ctx, _ = w.tracer.Start(ctx, "wrapper")
	return ctx
}

func (w wrapper) OnHandled(ctx context.Context, _ *ferry.EnhancedMessage, _ time.Duration, _ error) {
	trace.SpanFromContext(ctx).End()
}

func TestTracingEndsItsOwnSpan(t *testing.T) {
	tr, rec, tracer := newTracer(t)
	ctx := context.Background()
	b, err := ferry.NewBroker(ferry.WithHooks(tr, wrapper{tracer}))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "a", Queues: 1}))
	handled := make(chan struct{}, 1)
	c, err := b.NewConsumer("g", "a", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		handled <- struct{}{}
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	p, err := b.NewProducer()
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "a"})
	require.NoError(t, err)
	wait(t, handled, "handler call")
	require.NoError(t, c.Close())

	st := newSpanTree(rec.Ended())
	process, w := st.one(t, "process a"), st.one(t, "wrapper")
	assert.Equal(t, process.SpanContext().SpanID(), w.Parent().SpanID())
	assert.Len(t, rec.Ended(), 3, "send, process, wrapper: each ended")
	assert.Len(t, rec.Started(), 3)
}
