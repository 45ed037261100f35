package ferryotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferrymq/ferry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ObserveLag reports the lag of group on topic, per queue, as the
// ferry.consumer.lag gauge: each collection asks b ([ferry.Broker.Lag]);
// group comes first, as in every call of Ferry's that takes both. A
// broadcast member's cursor is a group of its own, "<group>@<member>". A
// group that has neither a cursor nor a live member yet
// ([ferry.ErrGroupNotFound]) has no series. A collection that fails (the
// broker closed, the topic deleted) reports nothing for the registration
// and returns the error to the meter provider, which hands it to the
// OpenTelemetry error handler: unregister before closing the broker. The
// registration holds no goroutine; Unregister it when done. A nil broker
// or an empty group or topic is [ferry.ErrInvalidOption].
func (m *Metrics) ObserveLag(b *ferry.Broker, group, topic string) (metric.Registration, error) {
	if b == nil || group == "" || topic == "" {
		return nil, fmt.Errorf("ferryotel: observe lag: %w: nil broker, or empty group or topic", ferry.ErrInvalidOption)
	}
	return m.observeLag(func(ctx context.Context) ([]ferry.GroupLag, error) {
		gl, err := b.Lag(ctx, group, topic)
		if errors.Is(err, ferry.ErrGroupNotFound) {
			return nil, nil // no cursor and no member yet: no lag series
		}
		if err != nil {
			return nil, fmt.Errorf("ferryotel: observe lag of %q on %q: %w", group, topic, err)
		}
		return []ferry.GroupLag{gl}, nil
	})
}

// ObserveGroups reports, as [Metrics.ObserveLag] does, the lag of every
// group with a cursor on topic ([ferry.Broker.Groups], which needs a
// cursor store that lists groups), as each collection finds them. A nil
// broker or an empty topic is [ferry.ErrInvalidOption].
func (m *Metrics) ObserveGroups(b *ferry.Broker, topic string) (metric.Registration, error) {
	if b == nil || topic == "" {
		return nil, fmt.Errorf("ferryotel: observe groups: %w: nil broker or empty topic", ferry.ErrInvalidOption)
	}
	return m.observeLag(func(ctx context.Context) ([]ferry.GroupLag, error) {
		lags, err := b.Groups(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("ferryotel: observe lag of %q: %w", topic, err)
		}
		return lags, nil
	})
}

// observeLag registers the lag gauge over what lags returns at each
// collection.
func (m *Metrics) observeLag(lags func(context.Context) ([]ferry.GroupLag, error)) (metric.Registration, error) {
	return m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		gls, err := lags(ctx)
		if err != nil {
			return err
		}
		for _, gl := range gls {
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
