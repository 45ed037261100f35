package ferryotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	ferryotel "github.com/ferrymq/ferry/otel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func newMetrics(t *testing.T) (*ferryotel.Metrics, *sdkmetric.ManualReader) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := ferryotel.NewMetrics(ferryotel.WithMeterProvider(mp))
	require.NoError(t, err)
	return m, reader
}

// collected is one collection of a reader.
type collected map[string]metricdata.Aggregation

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	c := collected{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, ferryotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			c[m.Name] = m.Data
		}
	}
	return c
}

// match reports whether set has every attribute of want.
func match(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds the counter's points whose attributes have want.
func (c collected) sum(name string, want ...attribute.KeyValue) int64 {
	s, ok := c[name].(metricdata.Sum[int64])
	if !ok {
		return -1
	}
	var n int64
	for _, p := range s.DataPoints {
		if match(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// count adds the histogram's counts of the points whose attributes have
// want.
func (c collected) count(name string, want ...attribute.KeyValue) int64 {
	h, ok := c[name].(metricdata.Histogram[float64])
	if !ok {
		return -1
	}
	var n int64
	for _, p := range h.DataPoints {
		if match(p.Attributes, want) {
			n += int64(p.Count)
		}
	}
	return n
}

// gauge returns the gauge's points by partition, for those with want.
func (c collected) gauge(name string, want ...attribute.KeyValue) map[string]int64 {
	g, ok := c[name].(metricdata.Gauge[int64])
	if !ok {
		return nil
	}
	out := map[string]int64{}
	for _, p := range g.DataPoints {
		if match(p.Attributes, want) {
			q, _ := p.Attributes.Value("messaging.destination.partition.id")
			out[q.AsString()] = p.Value
		}
	}
	return out
}

var (
	topicOrders = attribute.String("messaging.destination.name", "orders")
	topicDLQ    = attribute.String("messaging.destination.name", "%DLQ%g")
	groupG      = attribute.String("messaging.consumer.group.name", "g")
	system      = attribute.String("messaging.system", "ferry")
)

func errType(s string) attribute.KeyValue { return attribute.String("error.type", s) }

// A scripted run: "ok" succeeds, "flaky" fails once, "poison" fails for
// good at once; the counts are exact.
func TestMetricsScriptedRun(t *testing.T) {
	m, reader := newMetrics(t)
	ctx := context.Background()
	b, err := ferry.NewBroker(ferry.WithHooks(m))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2}))

	reg, err := m.ObserveLag(b, "g", "orders")
	require.NoError(t, err)
	defer reg.Unregister()

	p, err := b.NewProducer(ferry.WithRouter(ferry.ManualRouter(1)))
	require.NoError(t, err)
	defer p.Close()
	for _, body := range []string{"ok", "flaky", "poison"} {
		_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte(body)})
		require.NoError(t, err)
	}
	c0 := collect(t, reader)
	assert.Empty(t, c0.gauge(ferryotel.MetricLag, groupG, topicOrders), "a group with no cursor and no member has no lag series yet")

	var mu sync.Mutex
	succeeded := map[string]bool{}
	done := make(chan struct{}, 2)
	dead := make(deadLetters, 1)
	c, err := b.NewConsumer("g", "orders", ferry.HandlerFunc(func(ctx context.Context, msg *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		switch string(msg.Body) {
		case "flaky":
			if d.Attempt == 1 {
				return errors.New("once")
			}
		case "poison":
			return ferry.Permanent(errors.New("never"))
		}
		mu.Lock()
		succeeded[string(msg.Body)] = true
		mu.Unlock()
		done <- struct{}{}
		return nil
	}), ferry.WithRetry(3, 0), ferry.WithConsumerHooks(dead))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	wait(t, dead, "dead letter")
	wait(t, done, "success")
	wait(t, done, "success")
	require.NoError(t, c.Close())

	got := collect(t, reader)
	assert.Equal(t, int64(3), got.sum(ferryotel.MetricSent, topicOrders, system, attribute.String("messaging.operation.name", "send")))
	assert.Equal(t, int64(1), got.sum(ferryotel.MetricSent, topicDLQ))
	assert.Equal(t, int64(4), got.sum(ferryotel.MetricSent))
	assert.Equal(t, int64(4), got.count(ferryotel.MetricSendDuration))

	assert.Equal(t, int64(4), got.sum(ferryotel.MetricConsumed, topicOrders, groupG), "ok, flaky twice, poison")
	assert.Equal(t, int64(4), got.count(ferryotel.MetricProcess, topicOrders, groupG))
	assert.Equal(t, int64(1), got.count(ferryotel.MetricProcess, errType("*errors.errorString")), "flaky's first attempt")
	assert.Equal(t, int64(1), got.count(ferryotel.MetricProcess, errType("*ferry.permanentError")), "poison")

	assert.Equal(t, int64(1), got.sum(ferryotel.MetricDeadLettered, topicOrders,
		attribute.String("messaging.destination.partition.id", "1"), attribute.String(string(ferryotel.DeadLetterTopicKey), "%DLQ%g")))
	assert.Positive(t, got.count(ferryotel.MetricCommit, groupG, topicOrders))
	for _, p := range got[ferryotel.MetricCommit].(metricdata.Histogram[float64]).DataPoints {
		assert.False(t, p.Attributes.HasValue("error.type"), "no failed commit")
	}
	// The group's member of its retry topic (flaky's retry went there)
	// takes and gives up that topic's two queues too.
	assert.Equal(t, int64(2), got.sum(ferryotel.MetricRebalanced, groupG, topicOrders, attribute.Bool(string(ferryotel.AssignedKey), true)), "both queues taken")
	assert.Equal(t, int64(2), got.sum(ferryotel.MetricRebalanced, groupG, topicOrders, attribute.Bool(string(ferryotel.AssignedKey), false)), "and given up on Close")
	assert.Equal(t, int64(2), got.sum(ferryotel.MetricRebalanced, groupG, attribute.String("messaging.destination.name", ferry.RetryTopic("g", "orders")), attribute.Bool(string(ferryotel.AssignedKey), true)), "the retry topic's queues taken")
	assert.Equal(t, map[string]int64{"0": 0, "1": 0}, got.gauge(ferryotel.MetricLag, groupG, topicOrders), "all consumed")
	assert.Equal(t, succeeded, map[string]bool{"ok": true, "flaky": true})
}

// ObserveGroups reports every group with a cursor on the topic.
func TestMetricsObserveGroups(t *testing.T) {
	m, reader := newMetrics(t)
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for range 5 {
		_, err := p.Send(ctx, &ferry.Message{Topic: "orders"})
		require.NoError(t, err)
	}
	_, err = b.ResetGroup(ctx, "late", "orders", ferry.ResetToOffsets(map[int]int64{0: 2}))
	require.NoError(t, err)
	_, err = b.ResetGroup(ctx, "done", "orders", ferry.ResetToLatest())
	require.NoError(t, err)

	reg, err := m.ObserveGroups(b, "orders")
	require.NoError(t, err)
	got := collect(t, reader)
	assert.Equal(t, map[string]int64{"0": 3}, got.gauge(ferryotel.MetricLag, attribute.String("messaging.consumer.group.name", "late")))
	assert.Equal(t, map[string]int64{"0": 0}, got.gauge(ferryotel.MetricLag, attribute.String("messaging.consumer.group.name", "done")))

	require.NoError(t, reg.Unregister())
	assert.Nil(t, collect(t, reader).gauge(ferryotel.MetricLag), "nothing observed once unregistered")

	_, err = m.ObserveGroups(nil, "orders")
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = m.ObserveLag(b, "", "orders")
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// ObserveConsumer reports the buffer of each queue the consumer holds.
func TestMetricsObserveConsumer(t *testing.T) {
	m, reader := newMetrics(t)
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for range 3 {
		_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("0123456789")})
		require.NoError(t, err)
	}
	started := make(chan struct{}, 3)
	release := make(chan struct{})
	c, err := b.NewConsumer("g", "orders", ferry.HandlerFunc(func(ctx context.Context, _ *ferry.EnhancedMessage) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done(): // the test failed: Close cancels
		}
		return nil
	}), ferry.Ordered(), ferry.WithDrainTimeout(0))
	require.NoError(t, err)
	reg, err := m.ObserveConsumer(c, "g")
	require.NoError(t, err)
	defer reg.Unregister()
	assert.Nil(t, collect(t, reader).gauge(ferryotel.MetricBufferMsgs), "a consumer not started holds no queue")

	require.NoError(t, c.Start(ctx))
	wait(t, started, "first handler call")
	require.Eventually(t, func() bool {
		return collect(t, reader).gauge(ferryotel.MetricBufferMsgs, groupG)["0"] == 3
	}, watchdog, time.Millisecond, "the three messages fetched")
	got := collect(t, reader)
	assert.Equal(t, map[string]int64{"0": 30}, got.gauge(ferryotel.MetricBufferBytes, groupG, topicOrders))
	assert.Equal(t, map[string]int64{"0": 1}, got.gauge(ferryotel.MetricInFlight, groupG, topicOrders), "ordered: one at a time")
	assert.Equal(t, map[string]int64{"0": 0}, got.gauge(ferryotel.MetricBufferPaused, groupG, topicOrders))
	close(release)
	require.NoError(t, c.Close())
	assert.Nil(t, collect(t, reader).gauge(ferryotel.MetricBufferMsgs), "a closed consumer holds no queue")
}
