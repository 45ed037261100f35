package ferryotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferrymq/ferry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ObserveLag reports the lag of groups on topic, per queue, as the
// ferry.consumer.lag gauge: each collection asks b ([ferry.Broker.Lag]).
// With no group named it reports every group with a cursor on the topic
// ([ferry.Broker.Groups], which needs a cursor store that lists groups);
// a broadcast member's cursor is a group of its own,
// "<group>@<member>". A group named that has neither a cursor nor a live
// member yet ([ferry.ErrGroupNotFound]) has no series. A collection that fails (the broker closed, the
// topic deleted) reports nothing for the registration and returns the
// error to the meter provider, which hands it to the OpenTelemetry error
// handler: unregister before closing the broker. The registration holds
// no goroutine; Unregister it when done.
func (m *Metrics) ObserveLag(b *ferry.Broker, topic string, groups ...string) (metric.Registration, error) {
	if b == nil || topic == "" {
		return nil, fmt.Errorf("ferryotel: observe lag: %w: nil broker or empty topic", ferry.ErrInvalidOption)
	}
	groups = append([]string(nil), groups...)
	return m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var lags []ferry.GroupLag
		if len(groups) == 0 {
			var err error
			if lags, err = b.Groups(ctx, topic); err != nil {
				return fmt.Errorf("ferryotel: observe lag of %q: %w", topic, err)
			}
		}
		for _, g := range groups {
			gl, err := b.Lag(ctx, topic, g)
			if errors.Is(err, ferry.ErrGroupNotFound) {
				continue // no cursor and no member yet: no lag series
			}
			if err != nil {
				return fmt.Errorf("ferryotel: observe lag of %q on %q: %w", g, topic, err)
			}
			lags = append(lags, gl)
		}
		for _, gl := range lags {
			for _, ql := range gl.Queues {
				o.ObserveInt64(m.lag, ql.Lag, metric.WithAttributes(groupQueueAttrs(gl.Group, ql.Queue)...))
			}
		}
		return nil
	}, m.lag)
}

// StatsSource is what [Metrics.ObserveConsumer] reads: a
// [*ferry.Consumer] or a [*ferry.PullConsumer].
type StatsSource interface {
	Stats() ferry.ConsumerStats
}

// ObserveConsumer reports the queue buffers of c, a consumer of group,
// per queue it holds: ferry.consumer.buffer.messages and .bytes (fetched
// and not finished), ferry.consumer.in_flight (taken by handlers) and
// ferry.consumer.buffer.paused (1 while flow control pauses fetching).
// Each collection reads c.Stats(); a consumer not started or closed holds
// no queue and reports nothing. The registration holds no goroutine;
// Unregister it when done. (group names the consumer in the attributes:
// a consumer does not tell its group.)
func (m *Metrics) ObserveConsumer(c StatsSource, group string) (metric.Registration, error) {
	if c == nil {
		return nil, fmt.Errorf("ferryotel: observe consumer: %w: nil consumer", ferry.ErrInvalidOption)
	}
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, qs := range c.Stats().Queues {
			attrs := metric.WithAttributeSet(attribute.NewSet(groupQueueAttrs(group, qs.Queue)...))
			o.ObserveInt64(m.bufferMsgs, int64(qs.Buffer.Messages), attrs)
			o.ObserveInt64(m.bufferBytes, qs.Buffer.Bytes, attrs)
			o.ObserveInt64(m.inFlight, int64(qs.Buffer.InFlight), attrs)
			var paused int64
			if qs.Buffer.Paused {
				paused = 1
			}
			o.ObserveInt64(m.paused, paused, attrs)
		}
		return nil
	}, m.bufferMsgs, m.bufferBytes, m.inFlight, m.paused)
}
