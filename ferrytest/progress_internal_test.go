package ferrytest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// slowQueue is a correct memory queue whose writes take at least delay
// each, one at a time, as filestore's do when every write rolls a segment
// and retention deletes one (a few directory fsyncs under its write lock).
type slowQueue struct {
	*ferry.MemoryQueue
	delay time.Duration
	mu    sync.Mutex // serializes writes, as a store's write lock does
}

func (q *slowQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	time.Sleep(q.delay) // the cost modelled, not a wait for an event
	return q.MemoryQueue.Write(ctx, msgs)
}

// TestConcurrentRetentionReportsProgress: the watchdog fails a subtest
// that makes no progress within the timeout, not one that takes longer in
// all. ConcurrentRetention writes 300 batches; over a queue whose every
// write takes 5 ms it runs for 1.5 s at least, yet never goes 5 ms without
// a write, so a watchdog of 500 ms must let it finish. (Before the
// subtest reported its progress, this failed every time with "made no
// progress for 500ms", as filestore's ConcurrentRetention did now and
// then with the default 10 s on a loaded machine.)
func TestConcurrentRetentionReportsProgress(t *testing.T) {
	f := Features{Timeout: 500 * time.Millisecond}
	qs := &queueSuite{f: f, newQueue: func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
		id := ferry.QueueID{Topic: meta.Name, Queue: queue}
		return &slowQueue{MemoryQueue: ferry.NewMemoryQueue(id, meta.Retention), delay: 5 * time.Millisecond}
	}}
	run(t, f, "ConcurrentRetention", qs.concurrentRetention)
}
