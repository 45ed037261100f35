package filestore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// TestVerifyLiveStore runs Verify, and a read-only store's Segments,
// again and again while the owner writes, and a read-only reader follows
// the writes, under each sync policy: the end of a live active segment
// (space reserved ahead of the writes, a write in progress, a frame
// written while the reader scans on) is never damage, whatever moment
// the reader looks at. Writers on two queues write batches of 1 to 7
// messages, through roll-overs; Verify runs until they have written
// their share, and at least 10 times.
func TestVerifyLiveStore(t *testing.T) {
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncEvery(5 * time.Millisecond), filestore.SyncNever} {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			meta := ferry.TopicMeta{Name: "t", Queues: 2, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}
			w := open(t, dir, filestore.WithSync(p), filestore.WithSegmentBytes(256<<10))
			require.NoError(t, w.SaveTopic(ctx, meta))
			ro := openRO(t, dir)

			const perQueue = 3000
			var wg sync.WaitGroup
			var written atomic.Int64
			stop := make(chan struct{})
			var stopOnce sync.Once
			halt := func() {
				stopOnce.Do(func() { close(stop) })
				wg.Wait()
			}
			defer halt()
			for i := range meta.Queues {
				q := openQueue(t, w, meta, i)
				wg.Add(1)
				go func() { // a writer
					defer wg.Done()
					for n := 0; n < perQueue; {
						select {
						case <-stop:
							return
						default:
						}
						batch := make([]*ferry.EnhancedMessage, min(1+n%7, perQueue-n))
						for j := range batch {
							batch[j] = msg("t", n+j)
						}
						if _, err := q.Write(ctx, batch); !assert.NoError(t, err) {
							return
						}
						n += len(batch)
						written.Add(int64(len(batch)))
					}
				}()
			}
			rq, err := ro.OpenQueue(ctx, meta, 1)
			require.NoError(t, err)
			followed := make(chan error, 1)
			go func() { // a reader following queue 1 (ended by ro's Close at worst)
				dst := make([]*ferry.EnhancedMessage, 64)
				for off := int64(0); off < perQueue; {
					n, err := rq.Read(ctx, off, dst)
					if err != nil {
						followed <- err
						return
					}
					off += int64(n)
				}
				followed <- nil
			}()

			for runs := 0; runs < 10 || written.Load() < int64(meta.Queues*perQueue); runs++ {
				rep, err := filestore.Verify(dir)
				require.NoError(t, err)
				for _, pr := range rep.Problems {
					require.False(t, pr.Damage, "verify run %d, %d messages written: %v", runs, written.Load(), rep.Problems)
				}
				for i := range meta.Queues {
					segs, err := ro.Segments(ctx, "t", i)
					require.NoError(t, err)
					for _, s := range segs {
						require.False(t, s.Damage, "run %d: %s: %v", runs, s.File, s.TailErr)
					}
				}
			}
			halt()
			require.NoError(t, <-followed, "the reader followed the writer to the end")
			require.NoError(t, w.Close())
			rep, err := filestore.Verify(dir)
			require.NoError(t, err)
			require.Empty(t, rep.Problems, "the owner closed: every segment is exactly its frames")
			assert.Equal(t, int64(meta.Queues*perQueue), rep.Messages)
		})
	}
}
