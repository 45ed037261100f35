package bench

import (
	"context"
	"errors"
	"os"
	"sync"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// durableCases: Ferry over filestore, one topic of one queue, producers
// only (the write rate), under each sync policy. SyncAlways acknowledges a
// Send only after fdatasync; with SyncProducers concurrent producers the
// writers of the queue share each write and fdatasync (group commit).
func durableCases() []Case {
	concurrentN := func(s Sizes) int { return s.SyncProducers * s.SyncProducerN }
	return []Case{
		{Workload: 5, System: "ferry", Name: "ferry SyncNever", Ref: true, messages: allN, setup: durableCase(func(Sizes) filestore.SyncPolicy { return filestore.SyncNever }, false)},
		{Workload: 5, System: "ferry", Name: "ferry SyncEvery", messages: allN, setup: durableCase(func(s Sizes) filestore.SyncPolicy { return filestore.SyncEvery(s.SyncEvery) }, false)},
		{Workload: 5, System: "ferry", Name: "ferry SyncAlways", messages: syncN, setup: durableCase(func(Sizes) filestore.SyncPolicy { return filestore.SyncAlways }, false)},
		{Workload: 5, System: "ferry", Name: "ferry SyncAlways ×64", messages: concurrentN, setup: durableCase(func(Sizes) filestore.SyncPolicy { return filestore.SyncAlways }, true)},
	}
}

func durableCase(policy func(Sizes) filestore.SyncPolicy, concurrent bool) func(ctx context.Context, e *env) (*trial, error) {
	return func(ctx context.Context, e *env) (_ *trial, err error) {
		dir, err := os.MkdirTemp(e.Dir, "ferrybench-filestore-*")
		if err != nil {
			return nil, err
		}
		st, err := filestore.Open(dir, filestore.WithSync(policy(e.Sizes)))
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		b, err := ferry.NewBroker(ferry.WithStorage(st))
		if err != nil {
			return nil, errors.Join(err, st.Close(), os.RemoveAll(dir))
		}
		closeAll := func() error { return errors.Join(b.Close(), st.Close(), os.RemoveAll(dir)) }
		ret := ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}
		if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: ferryTopic, Queues: 1, Retention: ret}); err != nil {
			return nil, errors.Join(err, closeAll())
		}
		producers := 1
		if concurrent {
			producers = e.SyncProducers
		}
		ps := make([]*ferry.Producer, producers)
		for i := range ps {
			if ps[i], err = b.NewProducer(); err != nil {
				return nil, errors.Join(err, closeAll())
			}
		}
		return &trial{
			run: func(ctx context.Context) error {
				errs := make([]error, producers)
				var wg sync.WaitGroup
				for i, p := range ps {
					wg.Go(func() {
						m := &ferry.Message{Topic: ferryTopic, Body: e.body}
						for range split(e.n, producers, i) {
							if _, err := p.Send(ctx, m); err != nil {
								errs[i] = err
								return
							}
						}
					})
				}
				wg.Wait()
				return errors.Join(errs...)
			},
			close: closeAll,
		}, nil
	}
}
