package ferrytest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
)

// WriteCall records one Write or TryWrite call on a [FakeQueue].
type WriteCall struct {
	// Queue is the queue written to.
	Queue ferry.QueueID
	// Messages is the batch as passed (a copy of the slice; the messages
	// are the caller's, stamped by the queue when the write succeeded).
	Messages []*ferry.EnhancedMessage
	// First is the offset Write returned, -1 when it failed.
	First int64
	// Err is the error Write returned.
	Err error
}

// WriteHook is called before a write of a [FakeQueue] goes through: call
// counts the write calls so far, this one included (from 1). A non-nil
// error fails the write, storing nothing. A hook may block, to hold a
// write in flight until the test lets it go, and should then honour ctx.
type WriteHook func(ctx context.Context, call int, msgs []*ferry.EnhancedMessage) error

// ReadHook is called before a read of a [FakeQueue] goes through: call
// counts the read calls so far, this one included (from 1). A non-nil
// error fails the read.
type ReadHook func(ctx context.Context, call int, offset int64) error

// faults holds the injected faults of a queue or of a whole storage.
type faults struct {
	mu       sync.Mutex // guards every field below
	writes   int
	reads    int
	failNth  map[int]error
	delayNth map[int]time.Duration
	failAll  error
	onWrite  WriteHook
	onRead   ReadHook
	// Per topic, for a storage's faults: write calls so far and the
	// failures set by FailNthOf.
	topicWrites map[string]int
	topicFail   map[string]map[int]error
}

func (f *faults) failTopicOn(topic string, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.topicFail == nil {
		f.topicFail = map[string]map[int]error{}
	}
	if f.topicFail[topic] == nil {
		f.topicFail[topic] = map[int]error{}
	}
	f.topicFail[topic][n] = err
}

func (f *faults) failOn(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failNth == nil {
		f.failNth = map[int]error{}
	}
	f.failNth[n] = err
}

func (f *faults) delayOn(n int, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.delayNth == nil {
		f.delayNth = map[int]time.Duration{}
	}
	f.delayNth[n] = d
}

func (f *faults) set(fn func(f *faults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// write counts a write call and applies the faults set for it.
func (f *faults) write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int, error) {
	f.mu.Lock()
	f.writes++
	n := f.writes
	fail, delay, all, hook := f.failNth[n], f.delayNth[n], f.failAll, f.onWrite
	delete(f.failNth, n)
	delete(f.delayNth, n)
	if len(msgs) > 0 && msgs[0] != nil {
		topic := msgs[0].Topic
		if f.topicWrites == nil {
			f.topicWrites = map[string]int{}
		}
		f.topicWrites[topic]++
		if err, ok := f.topicFail[topic][f.topicWrites[topic]]; ok && fail == nil {
			fail = err
			delete(f.topicFail[topic], f.topicWrites[topic])
		}
	}
	f.mu.Unlock()
	if delay > 0 {
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return n, ctx.Err()
		}
	}
	if hook != nil {
		if err := hook(ctx, n, msgs); err != nil {
			return n, err
		}
	}
	if fail != nil {
		return n, fail
	}
	return n, all
}

// read counts a read call and applies the hook.
func (f *faults) read(ctx context.Context, offset int64) (int, error) {
	f.mu.Lock()
	f.reads++
	n, hook := f.reads, f.onRead
	f.mu.Unlock()
	if hook != nil {
		return n, hook(ctx, n, offset)
	}
	return n, nil
}

// FakeQueue is a [ferry.Queue] for tests: a [ferry.MemoryQueue] that
// records every write and can fail or delay the nth one. Without faults it
// behaves exactly as the memory queue (it passes [TestQueue]), including
// [ferry.TryWriter] and [ferry.Releaser].
//
// A write is all or nothing, as the Queue contract says, so a fault fails a
// whole Write call. A partial failure is the failure of one call among
// several: a [ferry.Producer.SendBatch] that writes one batch per queue,
// for example, can see its write to one queue succeed and the next fail
// (see [FakeStorage.FailNth], which counts writes across queues).
//
// Write faults apply to Write and TryWrite alike and are checked before
// the write reaches the memory queue, in this order: a delay, the
// [WriteHook], a FailNth error, a FailWrites error. Injected errors come
// back wrapped (errors.Is finds them) with the queue and call number.
//
// A FakeQueue is safe for concurrent use.
type FakeQueue struct {
	mem    *ferry.MemoryQueue
	own    faults
	shared *faults         // the storage's, or nil
	record func(WriteCall) // the storage's recorder, or nil

	isClosed atomic.Bool

	mu    sync.Mutex // guards calls
	calls []WriteCall
}

var (
	_ ferry.Queue     = (*FakeQueue)(nil)
	_ ferry.TryWriter = (*FakeQueue)(nil)
	_ ferry.Releaser  = (*FakeQueue)(nil)
)

// NewFakeQueue returns an empty fake queue with the given identity and
// retention (zero fields take their defaults, see [ferry.Retention]).
func NewFakeQueue(id ferry.QueueID, r ferry.Retention) *FakeQueue {
	return &FakeQueue{mem: ferry.NewMemoryQueue(id, r)}
}

// FailNth makes the nth write call (counting every Write and TryWrite on
// this queue from 1, failed ones included) fail with err, storing nothing.
// A call number already past never fires.
func (q *FakeQueue) FailNth(n int, err error) { q.own.failOn(n, err) }

// FailWrites makes every later write fail with err, storing nothing, until
// FailWrites(nil).
func (q *FakeQueue) FailWrites(err error) { q.own.set(func(f *faults) { f.failAll = err }) }

// DelayNth makes the nth write call wait d before going on; if its context
// ends first, it fails with the context's error, storing nothing.
func (q *FakeQueue) DelayNth(n int, d time.Duration) { q.own.delayOn(n, d) }

// OnWrite sets a hook called before every write (nil removes it).
func (q *FakeQueue) OnWrite(h WriteHook) { q.own.set(func(f *faults) { f.onWrite = h }) }

// OnRead sets a hook called before every read (nil removes it).
func (q *FakeQueue) OnRead(h ReadHook) { q.own.set(func(f *faults) { f.onRead = h }) }

// ID implements [ferry.Queue].
func (q *FakeQueue) ID() ferry.QueueID { return q.mem.ID() }

// Write implements [ferry.WritableQueue], applying the injected faults.
func (q *FakeQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, fmt.Errorf("ferrytest: write %s: %w", q.ID(), err)
	}
	return q.write(ctx, msgs, func() (int64, error) { return q.mem.Write(ctx, msgs) })
}

// TryWrite implements [ferry.TryWriter], applying the injected faults.
func (q *FakeQueue) TryWrite(msgs []*ferry.EnhancedMessage) (int64, error) {
	return q.write(context.Background(), msgs, func() (int64, error) { return q.mem.TryWrite(msgs) })
}

func (q *FakeQueue) write(ctx context.Context, msgs []*ferry.EnhancedMessage, do func() (int64, error)) (int64, error) {
	first, err := int64(-1), q.inject(ctx, msgs)
	if err == nil {
		first, err = do()
		if err != nil {
			first = -1
		}
	}
	c := WriteCall{Queue: q.ID(), Messages: slices.Clone(msgs), First: first, Err: err}
	q.mu.Lock()
	q.calls = append(q.calls, c)
	q.mu.Unlock()
	if q.record != nil {
		q.record(c)
	}
	return first, err
}

// inject applies the queue's faults, then the storage's.
func (q *FakeQueue) inject(ctx context.Context, msgs []*ferry.EnhancedMessage) error {
	n, err := q.own.write(ctx, msgs)
	if err != nil {
		return &ferry.Error{Op: fmt.Sprintf("ferrytest: write %s (call %d)", q.ID(), n), Err: err}
	}
	if q.shared != nil {
		n, err = q.shared.write(ctx, msgs)
		if err != nil {
			return &ferry.Error{Op: fmt.Sprintf("ferrytest: write %s (storage call %d)", q.ID(), n), Err: err}
		}
	}
	return nil
}

// Read implements [ferry.ReadableQueue], calling the read hook first.
func (q *FakeQueue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, fmt.Errorf("ferrytest: read %s: %w", q.ID(), err)
	}
	for _, f := range []*faults{&q.own, q.shared} {
		if f == nil {
			continue
		}
		if n, err := f.read(ctx, offset); err != nil {
			return 0, &ferry.Error{Op: fmt.Sprintf("ferrytest: read %s at %d (call %d)", q.ID(), offset, n), Err: err}
		}
	}
	return q.mem.Read(ctx, offset, dst)
}

// Offsets implements [ferry.ReadableQueue].
func (q *FakeQueue) Offsets() (oldest, next int64) { return q.mem.Offsets() }

// Release implements [ferry.Releaser].
func (q *FakeQueue) Release(offset int64) { q.mem.Release(offset) }

// Close implements [io.Closer]. It is idempotent; the records stay.
func (q *FakeQueue) Close() error {
	q.isClosed.Store(true)
	return q.mem.Close()
}

// Writes returns every write call so far, failed ones included, in the
// order they returned. The caller owns the slices.
func (q *FakeQueue) Writes() []WriteCall {
	q.mu.Lock()
	defer q.mu.Unlock()
	return cloneCalls(q.calls)
}

// cloneCalls copies calls and their batches, so the caller owns them.
func cloneCalls(calls []WriteCall) []WriteCall {
	out := slices.Clone(calls)
	for i := range out {
		out[i].Messages = slices.Clone(out[i].Messages)
	}
	return out
}

// Messages returns every message written so far, in offset order. Unlike
// Read it is not subject to retention or Close.
func (q *FakeQueue) Messages() []*ferry.EnhancedMessage {
	return messagesOf(q.Writes())
}

// messagesOf returns the messages of the successful calls, sorted by
// queue then offset.
func messagesOf(calls []WriteCall) []*ferry.EnhancedMessage {
	var out []*ferry.EnhancedMessage
	for _, c := range calls {
		if c.Err == nil {
			out = append(out, c.Messages...)
		}
	}
	slices.SortStableFunc(out, func(a, b *ferry.EnhancedMessage) int {
		if c := a.QueueID().Compare(b.QueueID()); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
	return out
}
