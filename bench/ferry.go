package bench

import (
	"context"
	"errors"
	"sync"

	"github.com/ferrymq/ferry"
)

// ferryCases: Ferry in memory. A message is sent with Producer.Send
// (SendBatch in workload 2) and handled by a push Consumer of group "g"
// with default options, which commits its cursor as it does by default.
// The topic is a bounded queue with back-pressure, as the Go channel is:
// its queues keep at most ferryBound messages between them and Send waits
// (Overflow Block) until the consumers have committed past the oldest. The
// "retain all" case keeps every message instead (DropOldest with bounds
// of at least n), as a log does by default, to show what that costs.
func ferryCases() []Case {
	return []Case{
		{Workload: 1, System: "ferry", Name: "ferry", Ref: true, messages: allN, setup: ferrySingle(false)},
		{Workload: 1, System: "ferry", Name: "ferry, retain all", messages: allN, setup: ferrySingle(true)},
		{Workload: 2, System: "ferry", Name: "ferry SendBatch", Ref: true, messages: allN, setup: ferryBatch},
		{Workload: 3, System: "ferry", Name: "ferry", Ref: true, messages: allN, setup: ferryGroup},
		{Workload: 4, System: "ferry", Name: "ferry", Ref: true, messages: latencyN, setup: ferryLatency},
	}
}

// ferryBound is the bound of the benchmark topic, shared by its queues:
// each holds ferryBound/queues messages, so that a topic of 8 queues takes
// no more memory than one of 1 (and the GC no more work).
const ferryBound = 1 << 16

const ferryTopic = "bench"

// ferryRig is a broker with the bench topic and its consumers.
type ferryRig struct {
	b         *ferry.Broker
	consumers []*ferry.Consumer
}

// newFerryRig makes a broker whose topic has queues queues, bounded with
// back-pressure or (retainAll) keeping all n messages, and starts
// consumers members of group "g".
func newFerryRig(ctx context.Context, e *env, queues, consumers int, retainAll bool) (_ *ferryRig, err error) {
	b, err := ferry.NewBroker()
	if err != nil {
		return nil, err
	}
	r := &ferryRig{b: b}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	ret := ferry.Retention{MaxMessages: int64(max(1024, ferryBound/queues)), Overflow: ferry.Block}
	if retainAll {
		ret = ferry.Retention{MaxMessages: int64(max(e.n, ferry.DefaultRetentionMessages)), MaxBytes: ferry.Unlimited}
	}
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: ferryTopic, Queues: queues, Retention: ret}); err != nil {
		return nil, err
	}
	h := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		e.sink.handle(m.Body)
		return nil
	})
	for range consumers {
		c, err := b.NewConsumer("g", ferryTopic, h)
		if err != nil {
			return nil, err
		}
		r.consumers = append(r.consumers, c)
	}
	// Start them together: each Start waits for its first assignment, which
	// a later member's join changes.
	errs := make([]error, len(r.consumers))
	var wg sync.WaitGroup
	for i, c := range r.consumers {
		wg.Go(func() { errs[i] = c.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *ferryRig) close() error {
	var errs []error
	for _, c := range r.consumers {
		errs = append(errs, c.Close())
	}
	errs = append(errs, r.b.Close())
	return errors.Join(errs...)
}

// newFerryOne is a rig of one queue and one consumer, with a producer.
func newFerryOne(ctx context.Context, e *env, retainAll bool) (*ferryRig, *ferry.Producer, error) {
	r, err := newFerryRig(ctx, e, 1, 1, retainAll)
	if err != nil {
		return nil, nil, err
	}
	p, err := r.b.NewProducer()
	if err != nil {
		return nil, nil, errors.Join(err, r.close())
	}
	return r, p, nil
}

func ferrySingle(retainAll bool) func(ctx context.Context, e *env) (*trial, error) {
	return func(ctx context.Context, e *env) (*trial, error) { return ferryOne(ctx, e, retainAll) }
}

func ferryOne(ctx context.Context, e *env, retainAll bool) (*trial, error) {
	r, p, err := newFerryOne(ctx, e, retainAll)
	if err != nil {
		return nil, err
	}
	m := &ferry.Message{Topic: ferryTopic, Body: e.body}
	return &trial{
		run: func(ctx context.Context) error {
			for range e.n {
				if _, err := p.Send(ctx, m); err != nil {
					return err
				}
			}
			return e.sink.wait(ctx)
		},
		close: r.close,
	}, nil
}

func ferryLatency(ctx context.Context, e *env) (*trial, error) {
	r, p, err := newFerryOne(ctx, e, false)
	if err != nil {
		return nil, err
	}
	return &trial{
		run: func(ctx context.Context) error {
			err := e.sink.pace(ctx, e.n, func(i int) error {
				// Built per send, as the channel's message is: a slice of
				// every message would be the GC's to mark through.
				_, err := p.Send(ctx, &ferry.Message{Topic: ferryTopic, Body: e.bodies[i]})
				return err
			})
			if err != nil {
				return err
			}
			return e.sink.wait(ctx)
		},
		close: r.close,
	}, nil
}

func ferryBatch(ctx context.Context, e *env) (*trial, error) {
	r, p, err := newFerryOne(ctx, e, false)
	if err != nil {
		return nil, err
	}
	m := &ferry.Message{Topic: ferryTopic, Body: e.body}
	batch := make([]*ferry.Message, e.Batch)
	for i := range batch {
		batch[i] = m
	}
	return &trial{
		run: func(ctx context.Context) error {
			for i := 0; i < e.n; i += e.Batch {
				if _, err := p.SendBatch(ctx, batch[:min(e.Batch, e.n-i)]); err != nil {
					return err
				}
			}
			return e.sink.wait(ctx)
		},
		close: r.close,
	}, nil
}

func ferryGroup(ctx context.Context, e *env) (*trial, error) {
	r, err := newFerryRig(ctx, e, e.Queues, e.Consumers, false)
	if err != nil {
		return nil, err
	}
	producers := make([]*ferry.Producer, e.Producers)
	for i := range producers {
		if producers[i], err = r.b.NewProducer(); err != nil {
			return nil, errors.Join(err, r.close())
		}
	}
	return &trial{
		run: func(ctx context.Context) error {
			errs := make([]error, len(producers))
			var wg sync.WaitGroup
			for i, p := range producers {
				wg.Go(func() {
					m := &ferry.Message{Topic: ferryTopic, Body: e.body}
					for range split(e.n, len(producers), i) {
						if _, err := p.Send(ctx, m); err != nil {
							errs[i] = err
							return
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return err
			}
			return e.sink.wait(ctx)
		},
		close: r.close,
	}, nil
}
