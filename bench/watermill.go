package bench

import (
	"context"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// watermillCases: Watermill's GoChannel (v1.5.1), non-persistent, output
// channels buffered like the Go channel peer's, every message acked by the
// subscriber loop as Watermill's docs do. It has no consumer groups: in
// workload 3 each consumer subscribes to its share of Queues topics.
func watermillCases() []Case {
	return []Case{
		{Workload: 1, System: "watermill", Name: "watermill gochannel", messages: slowN, setup: watermillSingle},
		{Workload: 2, System: "watermill", Name: "watermill gochannel Publish(100)", messages: slowN, setup: watermillBatch},
		{Workload: 3, System: "watermill", Name: "watermill gochannel", messages: slowN, setup: watermillGroup},
		{Workload: 4, System: "watermill", Name: "watermill gochannel", messages: latencyN, setup: watermillLatency},
	}
}

// watermillPubSub subscribes one loop per topic, each acking every message
// after handling it, and returns the pub/sub and a close that stops the
// loops.
func watermillPubSub(ctx context.Context, e *env, topics []string) (*gochannel.GoChannel, func() error, error) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: chanCap}, watermill.NopLogger{})
	var wg sync.WaitGroup
	for _, topic := range topics {
		msgs, err := ps.Subscribe(ctx, topic)
		if err != nil {
			_ = ps.Close()
			wg.Wait()
			return nil, nil, err
		}
		wg.Go(func() {
			for m := range msgs {
				e.sink.handle(m.Payload)
				m.Ack()
			}
		})
	}
	return ps, func() error { err := ps.Close(); wg.Wait(); return err }, nil
}

func newWatermillMessage(body []byte) *message.Message {
	return message.NewMessage(watermill.NewUUID(), body)
}

func watermillSingle(ctx context.Context, e *env) (*trial, error) {
	ps, stop, err := watermillPubSub(context.WithoutCancel(ctx), e, []string{"bench"})
	if err != nil {
		return nil, err
	}
	return &trial{
		run: func(ctx context.Context) error {
			for range e.n {
				if err := ps.Publish("bench", newWatermillMessage(e.body)); err != nil {
					return err
				}
			}
			return e.sink.wait(ctx)
		},
		close: stop,
	}, nil
}

func watermillLatency(ctx context.Context, e *env) (*trial, error) {
	ps, stop, err := watermillPubSub(context.WithoutCancel(ctx), e, []string{"bench"})
	if err != nil {
		return nil, err
	}
	return &trial{
		run: func(ctx context.Context) error {
			err := e.sink.pace(ctx, e.n, func(i int) error {
				return ps.Publish("bench", newWatermillMessage(e.bodies[i]))
			})
			if err != nil {
				return err
			}
			return e.sink.wait(ctx)
		},
		close: stop,
	}, nil
}

func watermillBatch(ctx context.Context, e *env) (*trial, error) {
	ps, stop, err := watermillPubSub(context.WithoutCancel(ctx), e, []string{"bench"})
	if err != nil {
		return nil, err
	}
	return &trial{
		run: func(ctx context.Context) error {
			for i := 0; i < e.n; i += e.Batch {
				batch := make([]*message.Message, min(e.Batch, e.n-i))
				for j := range batch {
					batch[j] = newWatermillMessage(e.body)
				}
				if err := ps.Publish("bench", batch...); err != nil {
					return err
				}
			}
			return e.sink.wait(ctx)
		},
		close: stop,
	}, nil
}

func watermillGroup(ctx context.Context, e *env) (*trial, error) {
	topics := make([]string, e.Queues)
	for i := range topics {
		topics[i] = "bench." + strconv.Itoa(i)
	}
	ps, stop, err := watermillPubSub(context.WithoutCancel(ctx), e, topics)
	if err != nil {
		return nil, err
	}
	return &trial{
		run: func(ctx context.Context) error {
			errs := make([]error, e.Producers)
			var pw sync.WaitGroup
			for p := range e.Producers {
				pw.Go(func() {
					q := p
					for range split(e.n, e.Producers, p) {
						if err := ps.Publish(topics[q%len(topics)], newWatermillMessage(e.body)); err != nil {
							errs[p] = err
							return
						}
						q++
					}
				})
			}
			pw.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			return e.sink.wait(ctx)
		},
		close: stop,
	}, nil
}
