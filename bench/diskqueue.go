package bench

import (
	"context"
	"errors"
	"os"
	"time"

	diskqueue "github.com/nsqio/go-diskqueue"
)

// diskqueueCases: nsq's go-diskqueue v1.1.0, the write rate of Put (one
// message a call, no reader). "nsqd defaults" is nsqd's configuration
// (100 MiB files, fsync every 2,500 operations or 2 s), nsq's normal
// durability; "sync every 1" fsyncs after every write, its SyncAlways.
func diskqueueCases() []Case {
	return []Case{
		{Workload: 5, System: "diskqueue", Name: "diskqueue nsqd defaults", messages: allN, setup: diskqueueCase(2500)},
		{Workload: 5, System: "diskqueue", Name: "diskqueue sync every 1", messages: syncN, setup: diskqueueCase(1)},
	}
}

func syncN(s Sizes) int { return s.SyncN }

func diskqueueCase(syncEvery int64) func(ctx context.Context, e *env) (*trial, error) {
	return func(_ context.Context, e *env) (*trial, error) {
		dir, err := os.MkdirTemp(e.Dir, "ferrybench-diskqueue-*")
		if err != nil {
			return nil, err
		}
		logf := func(diskqueue.LogLevel, string, ...any) {}
		dq := diskqueue.New("bench", dir, 100<<20, 0, 1<<20, syncEvery, 2*time.Second, logf)
		return &trial{
			run: func(ctx context.Context) error {
				for i := range e.n {
					if err := dq.Put(e.body); err != nil {
						return err
					}
					if i&1023 == 0 && ctx.Err() != nil {
						return ctx.Err()
					}
				}
				return nil
			},
			close: func() error { return errors.Join(dq.Close(), os.RemoveAll(dir)) },
		}, nil
	}
}
