package ferryotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Metric names. The messaging.* ones are the OpenTelemetry semantic
// conventions'; ferry.* are Ferry's own, where the conventions have none.
const (
	MetricSent          = "messaging.client.sent.messages"
	MetricSendDuration  = "messaging.client.operation.duration"
	MetricConsumed      = "messaging.client.consumed.messages"
	MetricProcess       = "messaging.process.duration"
	MetricDeadLettered  = "ferry.consumer.dead_lettered"
	MetricCommit        = "ferry.consumer.commit.duration"
	MetricRebalanced    = "ferry.consumer.rebalanced"
	MetricResets        = "ferry.consumer.resets"
	MetricLag           = "ferry.consumer.lag"
	MetricBufferMsgs    = "ferry.consumer.buffer.messages"
	MetricBufferBytes   = "ferry.consumer.buffer.bytes"
	MetricInFlight      = "ferry.consumer.in_flight"
	MetricBufferPaused  = "ferry.consumer.buffer.paused"
	metricUnitMessages  = "{message}"
	metricUnitSeconds   = "s"
	metricUnitBytes     = "By"
	metricUnitRebalance = "{rebalance}"
	metricUnitReset     = "{reset}"
)

// durationBuckets are the semantic conventions' advice for messaging
// durations, with finer buckets below 5 ms in front: in-process
// messaging is mostly faster than that.
var durationBuckets = []float64{
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
	0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
}

// Metrics is a [ferry.Hook] that counts and times sends, handler calls,
// commits, dead letters, rebalances and cursor resets, and reports
// consumer lag and buffers for what [Metrics.ObserveLag],
// [Metrics.ObserveGroups] and [Metrics.ObserveConsumer] register (see the
// package doc for the instruments and their attributes). It is safe for
// concurrent use, and holds no goroutine: the observable gauges are read
// by the meter provider's readers when they collect.
type Metrics struct {
	meter metric.Meter

	sent         metric.Int64Counter
	sendDuration metric.Float64Histogram
	consumed     metric.Int64Counter
	process      metric.Float64Histogram
	deadLettered metric.Int64Counter
	commit       metric.Float64Histogram
	rebalanced   metric.Int64Counter
	resets       metric.Int64Counter

	lag         metric.Int64ObservableGauge
	bufferMsgs  metric.Int64ObservableGauge
	bufferBytes metric.Int64ObservableGauge
	inFlight    metric.Int64ObservableGauge
	paused      metric.Int64ObservableGauge

	// sets caches the attribute sets of successful events, by what they
	// are of: a measurement then allocates nothing.
	sets sync.Map // setKey → metric.MeasurementOption
}

var (
	_ ferry.HookSent         = (*Metrics)(nil)
	_ ferry.HookHandled      = (*Metrics)(nil)
	_ ferry.HookCommitted    = (*Metrics)(nil)
	_ ferry.HookDeadLettered = (*Metrics)(nil)
	_ ferry.HookRebalanced   = (*Metrics)(nil)
	_ ferry.HookReset        = (*Metrics)(nil)
)

// NewMetrics returns a metrics hook configured by opts, its instruments
// made. An error is the meter's, making an instrument.
func NewMetrics(opts ...MetricsOption) (*Metrics, error) {
	var c metricsConfig
	for _, o := range opts {
		o(&c)
	}
	c.defaults()
	m := &Metrics{meter: c.provider.Meter(ScopeName)}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		i, err := m.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return i
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		i, err := m.meter.Float64Histogram(name, metric.WithUnit(metricUnitSeconds), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return i
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		i, err := m.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return i
	}
	m.sent = counter(MetricSent, metricUnitMessages, "Number of messages producer attempted to send to the broker.")
	m.sendDuration = histogram(MetricSendDuration, "Duration of messaging operation initiated by a producer or consumer client.")
	m.consumed = counter(MetricConsumed, metricUnitMessages, "Number of messages that were delivered to the application.")
	m.process = histogram(MetricProcess, "Duration of processing operation.")
	m.deadLettered = counter(MetricDeadLettered, metricUnitMessages, "Number of messages sent to a dead-letter topic.")
	m.commit = histogram(MetricCommit, "Duration of cursor commits.")
	m.rebalanced = counter(MetricRebalanced, metricUnitRebalance, "Number of queues a consumer took (assigned true) or gave up (false).")
	m.resets = counter(MetricResets, metricUnitReset, "Number of cursors reset after falling out of the retained range.")
	m.lag = gauge(MetricLag, metricUnitMessages, "Retained messages a consumer group has still to consume, per queue.")
	m.bufferMsgs = gauge(MetricBufferMsgs, metricUnitMessages, "Messages fetched into a consumer's queue buffer and not finished.")
	m.bufferBytes = gauge(MetricBufferBytes, metricUnitBytes, "Bytes fetched into a consumer's queue buffer and not finished.")
	m.inFlight = gauge(MetricInFlight, metricUnitMessages, "Messages taken by handlers and not finished.")
	m.paused = gauge(MetricBufferPaused, "1", "1 while flow control pauses fetching into a consumer's queue buffer, else 0.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// setKey names a cached attribute set.
type setKey struct {
	op    string
	group string
	q     ferry.QueueID
	extra string
}

// attrs returns the measurement option of k's attribute set, made by
// mk once.
func (m *Metrics) attrs(k setKey, mk func() []attribute.KeyValue) metric.MeasurementOption {
	if v, ok := m.sets.Load(k); ok {
		return v.(metric.MeasurementOption)
	}
	o := metric.WithAttributeSet(attribute.NewSet(mk()...))
	v, _ := m.sets.LoadOrStore(k, o)
	return v.(metric.MeasurementOption)
}

func sendAttrs(q ferry.QueueID) []attribute.KeyValue {
	return []attribute.KeyValue{
		systemAttr,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationNameKey.String(opSend),
		semconv.MessagingDestinationNameKey.String(q.Topic),
		partition(q.Queue),
	}
}

func processAttrs(group string, q ferry.QueueID) []attribute.KeyValue {
	return []attribute.KeyValue{
		systemAttr,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationNameKey.String(opProcess),
		semconv.MessagingConsumerGroupNameKey.String(group),
		semconv.MessagingDestinationNameKey.String(q.Topic),
		partition(q.Queue),
	}
}

func groupQueueAttrs(group string, q ferry.QueueID) []attribute.KeyValue {
	return []attribute.KeyValue{
		systemAttr,
		semconv.MessagingConsumerGroupNameKey.String(group),
		semconv.MessagingDestinationNameKey.String(q.Topic),
		partition(q.Queue),
	}
}

// withError returns the option of attrs plus err's error.type.
func withError(attrs []attribute.KeyValue, err error) metric.MeasurementOption {
	return metric.WithAttributes(append(attrs, errorType(err))...)
}

// OnSent counts em's send and records its duration, from em.BornTime (so
// with the millisecond resolution BornTime has under load; see
// [ferry.EnhancedMessage]); a failed send has error.type.
func (m *Metrics) OnSent(ctx context.Context, em *ferry.EnhancedMessage, err error) {
	took := time.Since(em.BornTime()).Seconds()
	q := em.QueueID()
	var o metric.MeasurementOption
	if err != nil {
		o = withError(sendAttrs(q), err)
	} else {
		o = m.attrs(setKey{op: opSend, q: q}, func() []attribute.KeyValue { return sendAttrs(q) })
	}
	m.sent.Add(ctx, 1, o)
	m.sendDuration.Record(ctx, took, o)
}

// OnHandled counts a handler call of msg as a consumed message and
// records its duration; a failed call has error.type.
func (m *Metrics) OnHandled(ctx context.Context, msg *ferry.EnhancedMessage, took time.Duration, err error) {
	d, _ := ferry.DeliveryFrom(ctx)
	q := msg.QueueID()
	o := m.attrs(setKey{op: opProcess, group: d.Group, q: q}, func() []attribute.KeyValue { return processAttrs(d.Group, q) })
	m.consumed.Add(ctx, 1, o)
	if err != nil {
		o = withError(processAttrs(d.Group, q), err)
	}
	m.process.Record(ctx, took.Seconds(), o)
}

// OnCommitted records the commit's duration; a failed commit has
// error.type.
func (m *Metrics) OnCommitted(e ferry.CommitEvent) {
	mk := func() []attribute.KeyValue {
		return append(groupQueueAttrs(e.Group, e.Queue), semconv.MessagingOperationNameKey.String(opCommit))
	}
	var o metric.MeasurementOption
	if e.Err != nil {
		o = withError(mk(), e.Err)
	} else {
		o = m.attrs(setKey{op: opCommit, group: e.Group, q: e.Queue}, mk)
	}
	m.commit.Record(context.Background(), e.Took.Seconds(), o)
}

// OnDeadLettered counts the dead letter of msg, by msg's topic and
// queue and the dead-letter topic. (The hook is not told the group.)
func (m *Metrics) OnDeadLettered(msg *ferry.EnhancedMessage, dl ferry.SendResult, _ int, _ error) {
	q := msg.QueueID()
	o := m.attrs(setKey{op: opDeadLetter, q: q, extra: dl.Queue.Topic}, func() []attribute.KeyValue {
		return []attribute.KeyValue{
			systemAttr,
			semconv.MessagingDestinationNameKey.String(q.Topic),
			partition(q.Queue),
			DeadLetterTopicKey.String(dl.Queue.Topic),
		}
	})
	m.deadLettered.Add(context.Background(), 1, o)
}

// OnRebalanced counts the queue taken or given up.
func (m *Metrics) OnRebalanced(group, _ string, q ferry.QueueID, assigned bool) {
	extra := "revoked"
	if assigned {
		extra = "assigned"
	}
	o := m.attrs(setKey{op: "rebalance", group: group, q: q, extra: extra}, func() []attribute.KeyValue {
		return append(groupQueueAttrs(group, q), AssignedKey.Bool(assigned))
	})
	m.rebalanced.Add(context.Background(), 1, o)
}

// OnReset counts the cursor reset.
func (m *Metrics) OnReset(group string, q ferry.QueueID, _, _ int64) {
	m.resets.Add(context.Background(), 1, metric.WithAttributes(groupQueueAttrs(group, q)...))
}
