package filestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/ferrymq/ferry/internal/dedup"
)

// queue is a file-backed [ferry.Queue]: a folder of segments, a writer
// goroutine, and a cache of the most recent messages for readers that keep
// up. With SyncAlways the writer goroutine group-commits every write; with
// SyncEvery and SyncNever a writer appends its own messages under wmu (no
// handoff), and the goroutine keeps the timers, Block overflow's waiting
// writes and the retention passes asked for by readers.
type queue struct {
	id  ferry.QueueID
	st  *Store
	dir string // folder within the store's root
	cfg *config
	key frameKey // what its frames carry

	// segMu guards segs and segsClosed; disk reads hold it shared. A
	// segment's accounting (next, size, sizeSum, times, index) changes
	// only under wmu, and the active segment's also under mu, where a
	// writer adds its frames when it publishes them: read it holding
	// wmu, or segMu shared and then mu.
	segMu      sync.RWMutex
	segs       []*segment // by base offset; the last is active
	segsClosed bool       // the files are closed

	mu         sync.Mutex // guards every field below
	ret        ferry.Retention
	oldest     int64
	next       int64
	cache      []*ferry.EnhancedMessage // cache[cacheHead:] are offsets cacheBase on
	cacheHead  int
	cacheBase  int64
	cacheBytes int64
	readers    []chan struct{}
	released   int64 // Block overflow: offsets below may be dropped
	closed     bool
	failed     error                      // set once; every later write fails with it
	state      atomic.Pointer[writeState] // closed, failed and ret, for writeDirect
	window     atomic.Int64               // dd's window, for DedupWindow; 0 when off

	reqs    chan *writeReq
	kick    chan struct{}   // retention or release news, capacity 1
	retainC chan chan error // synchronous retention pass
	stop    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex // serializes Close
	closeEr error      // what the first Close returned

	// wmu serializes appends, rolls, syncs and deletes: the writer
	// goroutine holds it while it handles an event (but for SyncEvery's
	// fdatasync, under syncMu alone), a direct writer while it appends.
	// It guards every field below and the files' contents. Lock order:
	// wmu, then syncMu, then segMu, then mu.
	wmu      sync.Mutex
	syncMu   sync.Mutex // held by SyncEvery's sync outside wmu and by retention closing files
	pending  []*writeReq
	enc      []byte
	ends     []int
	out      []byte
	flat     []*ferry.EnhancedMessage
	frames   []frameInfo
	spans    [][2]int  // of enc, the messages of each frame
	clock    time.Time // the last full reading of the clock (stamp)
	dirty    bool      // bytes written since the last fdatasync
	ageArmed bool      // the writer goroutine's age timer is set
	// dd is the deduplication window (nil: off), rebuilt at open from the
	// messages stored within it; keep is a deduplicated write's scratch.
	dd   *dedup.Window
	keep []*ferry.EnhancedMessage
	keys dedup.Keys // a deduplicated write's keys' hashes
	// groupHint is about the size of the largest recent groups
	// (SyncAlways): the writer goroutine waits a little for a group to
	// reach it. lastSync is how long the last fdatasync took.
	groupHint int
	lastSync  time.Duration
}

var (
	_ ferry.Queue        = (*queue)(nil)
	_ ferry.TryWriter    = (*queue)(nil)
	_ ferry.Releaser     = (*queue)(nil)
	_ ferry.Deduplicator = (*queue)(nil)
)

// writeState is what a direct write checks first, published under mu
// whenever it changes, so that a write reads it without taking mu.
type writeState struct {
	closed bool
	failed error
	ret    ferry.Retention
}

// publishState publishes closed, failed and ret. q.mu must be held.
func (q *queue) publishState() {
	q.state.Store(&writeState{closed: q.closed, failed: q.failed, ret: q.ret})
}

// reqsBuffer is the capacity of a queue's channel of writes, so that a
// writer queues its write without waiting for the writer goroutine to
// take it (one park per write, on its result, instead of two).
const reqsBuffer = 256

// reqPool holds writeReqs whose result was received: the writer goroutine
// no longer refers to them. A canceled one may still be in q.pending or
// q.reqs and is left to the garbage collector.
var reqPool = sync.Pool{New: func() any { return &writeReq{done: make(chan writeRes, 1)} }}

// writeReq is one Write waiting for the writer goroutine.
type writeReq struct {
	msgs  []*ferry.EnhancedMessage
	size  int64
	try   bool
	state atomic.Int32 // reqPending, then reqTaken by the writer or reqCanceled by the caller
	done  chan writeRes
}

const (
	reqPending int32 = iota
	reqTaken
	reqCanceled
)

type writeRes struct {
	first int64
	err   error
}

// newQueue rebuilds the deduplication window (of window, normalized) of
// a recovered queue and starts its writer goroutine. If the rebuild
// fails it closes the segments' files and returns the error.
func newQueue(st *Store, id ferry.QueueID, dir string, segs []*segment, ret ferry.Retention, window time.Duration) (*queue, error) {
	q := &queue{
		id: id, st: st, dir: dir, cfg: &st.cfg, key: st.key(id), segs: segs, ret: ret,
		oldest:  segs[0].base,
		next:    segs[len(segs)-1].next,
		reqs:    make(chan *writeReq, reqsBuffer),
		kick:    make(chan struct{}, 1),
		retainC: make(chan chan error),
		stop:    make(chan struct{}),
	}
	q.cacheBase = q.next
	q.publishState()
	q.mapActive(segs[len(segs)-1])
	q.wmu.Lock()
	err := q.setDedupLocked(window)
	q.wmu.Unlock()
	if err != nil {
		_ = q.unmap(segs[len(segs)-1])
		for _, s := range segs {
			if s.f != nil {
				_ = s.f.Close()
			} else {
				_ = st.fds.drop(s)
			}
		}
		return nil, err
	}
	q.wg.Add(1)
	go q.run()
	return q, nil
}

// ID implements [ferry.Queue].
func (q *queue) ID() ferry.QueueID { return q.id }

// setRetention replaces the retention bounds (from OpenQueue's meta).
func (q *queue) setRetention(r ferry.Retention) {
	q.mu.Lock()
	q.ret = r
	q.publishState()
	q.mu.Unlock()
	q.poke()
}

func (q *queue) poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Write implements [ferry.WritableQueue]. With [SyncAlways] it returns once
// the messages are on disk. ctx is checked before the write is queued for
// the writer goroutine; a queued write then waits for its group's
// fdatasync, and with [ferry.Block] overflow leaves when ctx ends while it
// waits for room.
func (q *queue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: err}
	}
	return q.write(ctx, msgs, false)
}

// TryWrite implements [ferry.TryWriter].
func (q *queue) TryWrite(msgs []*ferry.EnhancedMessage) (int64, error) {
	return q.write(context.Background(), msgs, true)
}

// maxCodecGrowth bounds how much the encoding of a message grows when the
// queue sets its Offset and StoreUnixNano (two varints of at most 10 bytes).
const maxCodecGrowth = 20

// maxCodecFixed bounds what the encoding of a message without headers
// adds to its Size, its Topic and its Origin's two strings: version, ID,
// queue, offset, two times, six string lengths (the dedup key's with
// version 2) and two counts, each varint at most 10 bytes. A message that
// fits with it needs no exact codec.Size.
const maxCodecFixed = 1 + 16 + 4*10 + 6*10 + 2*10

func (q *queue) write(ctx context.Context, msgs []*ferry.EnhancedMessage, try bool) (int64, error) {
	var size int64
	for i, m := range msgs {
		if m == nil {
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s: message %d", q.id, i), Err: fmt.Errorf("%w: nil", ferry.ErrInvalidMessage)}
		}
		ms, limit := m.Size(), q.cfg.maxFrameBytes-frameHeader
		if len(m.Headers) > 0 || ms+len(m.Topic)+len(m.BornHost())+len(m.ProducerName())+maxCodecFixed+maxCodecGrowth > limit {
			if n := codec.Size(m) + maxCodecGrowth; n > limit {
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s: message %d", q.id, i), Err: fmt.Errorf("%w: %d bytes encoded, a frame holds %d", ferry.ErrMessageTooLarge, n, limit)}
			}
		}
		size += int64(ms)
	}
	if err := ctx.Err(); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: err}
	}
	if q.cfg.sync.mode() != syncAlways {
		if first, err, done := q.writeDirect(msgs, size); done {
			return first, err
		}
	}
	s := q.state.Load()
	switch {
	case s.closed:
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ferry.ErrClosed}
	case s.failed != nil:
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: s.failed}
	case over(int64(len(msgs)), s.ret.MaxMessages) || over(size, s.ret.MaxBytes):
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: fmt.Errorf("%w: batch of %d messages, %d bytes exceeds retention", ferry.ErrMessageTooLarge, len(msgs), size)}
	case len(msgs) == 0:
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.next, nil
	}
	r := reqPool.Get().(*writeReq)
	r.msgs, r.size, r.try = msgs, size, try
	r.state.Store(reqPending)
	select {
	case q.reqs <- r:
	default:
		select {
		case q.reqs <- r:
		case <-q.stop:
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ferry.ErrClosed}
		case <-ctx.Done():
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ctx.Err()}
		}
	}
	// Close publishes closed, then the writer goroutine answers what is
	// in q.reqs and stops: a write queued before it sees closed is
	// answered, one queued later answers itself. (Waiting on q.stop
	// instead would make every waiting writer queue on that one channel.)
	s = q.state.Load()
	if s.closed && r.state.CompareAndSwap(reqPending, reqCanceled) {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ferry.ErrClosed}
	}
	// A queued write is committed by the next group, except with Block
	// overflow, where it may wait for room as long as ctx lets it.
	// Waiting on ctx otherwise would make the writers sharing a context
	// queue on its one channel at every group.
	if cancel := ctx.Done(); cancel != nil && s.ret.Overflow == ferry.Block {
		select {
		case res := <-r.done:
			r.msgs = nil
			reqPool.Put(r) // the writer goroutine is done with it
			return res.first, res.err
		case <-cancel:
			if r.state.CompareAndSwap(reqPending, reqCanceled) {
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ctx.Err()}
			}
			// The writer has the batch: it is all or nothing, wait for which.
		}
	}
	res := <-r.done
	r.msgs = nil
	reqPool.Put(r)
	return res.first, res.err
}

// writeDirect appends msgs in the calling goroutine under wmu, for
// SyncEvery and SyncNever: its bytes are in the page cache when it
// returns. It reports done false, having done nothing, when the queue
// has Block overflow, whose writes wait in the writer goroutine for room.
func (q *queue) writeDirect(msgs []*ferry.EnhancedMessage, size int64) (first int64, err error, done bool) {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	s := q.state.Load()
	closed, failed, ret, next := s.closed, s.failed, s.ret, q.next // q.next: every writer holds wmu
	switch {
	case closed:
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ferry.ErrClosed}, true
	case failed != nil:
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: failed}, true
	case over(int64(len(msgs)), ret.MaxMessages) || over(size, ret.MaxBytes):
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: fmt.Errorf("%w: batch of %d messages, %d bytes exceeds retention", ferry.ErrMessageTooLarge, len(msgs), size)}, true
	case len(msgs) == 0:
		return next, nil, true
	case ret.Overflow == ferry.Block:
		return 0, nil, false
	}
	if err := q.appendMsgs(msgs, ret); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: err}, true
	}
	return next, nil, true
}

// Close implements [io.Closer]: it stops the writer goroutine (pending
// writes fail with [ferry.ErrClosed]), syncs unless [SyncNever], wakes
// blocked readers and closes the files. It is idempotent.
func (q *queue) Close() error {
	q.closeMu.Lock()
	defer q.closeMu.Unlock()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return q.closeEr
	}
	q.closed = true
	q.publishState()
	q.wakeReaders()
	q.mu.Unlock()
	close(q.stop)
	q.wg.Wait()
	// A direct writer that got in before closed was set finishes first.
	q.wmu.Lock()
	var errs []error
	if _, err := q.seal(q.segs[len(q.segs)-1]); err != nil { // done by the writer goroutine unless it failed
		errs = append(errs, err)
	}
	q.segMu.Lock()
	for _, s := range q.segs {
		if s.f != nil {
			errs = append(errs, s.f.Close())
		} else {
			errs = append(errs, q.st.fds.drop(s))
		}
	}
	q.segsClosed = true
	q.segMu.Unlock()
	q.wmu.Unlock()
	q.mu.Lock()
	q.cache, q.cacheHead, q.cacheBase = nil, 0, q.next
	if q.failed != nil {
		errs = append(errs, q.failed)
	}
	q.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		q.closeEr = &ferry.Error{Op: fmt.Sprintf("filestore: close %s", q.id), Err: err}
	}
	q.st.forget(q)
	return q.closeEr
}
