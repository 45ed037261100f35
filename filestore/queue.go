package filestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
)

// queue is a file-backed [ferry.Queue]: a folder of segments, one writer
// goroutine that group-commits the writes, and a cache of the most recent
// messages for readers that keep up.
type queue struct {
	id  ferry.QueueID
	st  *Store
	dir string // folder within the store's root
	cfg *config

	segMu      sync.RWMutex // guards segs, their fields and segsClosed; disk reads hold it shared
	segs       []*segment   // by base offset; the last is active
	segsClosed bool         // the files are closed

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
	failed     error // set once; every later write fails with it

	reqs    chan *writeReq
	kick    chan struct{}   // retention or release news, capacity 1
	retainC chan chan error // synchronous retention pass
	stop    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex // serializes Close
	closeEr error      // what the first Close returned

	// Owned by the writer goroutine.
	pending []*writeReq
	enc     []byte
	ends    []int
	out     []byte
	dirty   bool // bytes written since the last fdatasync
}

var (
	_ ferry.Queue     = (*queue)(nil)
	_ ferry.TryWriter = (*queue)(nil)
	_ ferry.Releaser  = (*queue)(nil)
)

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

// newQueue starts the writer goroutine of a recovered queue.
func newQueue(st *Store, id ferry.QueueID, dir string, segs []*segment, ret ferry.Retention) *queue {
	q := &queue{
		id: id, st: st, dir: dir, cfg: &st.cfg, segs: segs, ret: ret,
		oldest:  segs[0].base,
		next:    segs[len(segs)-1].next,
		reqs:    make(chan *writeReq),
		kick:    make(chan struct{}, 1),
		retainC: make(chan chan error),
		stop:    make(chan struct{}),
	}
	q.cacheBase = q.next
	q.wg.Add(1)
	go q.run()
	return q
}

// ID implements [ferry.Queue].
func (q *queue) ID() ferry.QueueID { return q.id }

// setRetention replaces the retention bounds (from OpenQueue's meta).
func (q *queue) setRetention(r ferry.Retention) {
	q.mu.Lock()
	q.ret = r
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
// the messages are on disk.
func (q *queue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	return q.write(ctx, msgs, false)
}

// TryWrite implements [ferry.TryWriter].
func (q *queue) TryWrite(msgs []*ferry.EnhancedMessage) (int64, error) {
	return q.write(context.Background(), msgs, true)
}

// maxCodecGrowth bounds how much the encoding of a message grows when the
// queue sets its Offset and StoreTime (two varints of at most 10 bytes).
const maxCodecGrowth = 20

func (q *queue) write(ctx context.Context, msgs []*ferry.EnhancedMessage, try bool) (int64, error) {
	var size int64
	for i, m := range msgs {
		if m == nil {
			return 0, fmt.Errorf("ferry: write %s: message %d: %w: nil", q.id, i, ferry.ErrInvalidMessage)
		}
		if n := ferry.EncodedSize(m) + maxCodecGrowth; n > q.cfg.maxFrameBytes-frameHeader {
			return 0, fmt.Errorf("ferry: write %s: message %d: %w: %d bytes encoded, a frame holds %d", q.id, i, ferry.ErrMessageTooLarge, n, q.cfg.maxFrameBytes-frameHeader)
		}
		size += int64(m.Size())
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("ferry: write %s: %w", q.id, err)
	}
	q.mu.Lock()
	closed, failed, ret, next := q.closed, q.failed, q.ret, q.next
	q.mu.Unlock()
	switch {
	case closed:
		return 0, fmt.Errorf("ferry: write %s: %w", q.id, ferry.ErrClosed)
	case failed != nil:
		return 0, fmt.Errorf("ferry: write %s: %w", q.id, failed)
	case over(int64(len(msgs)), ret.MaxMessages) || over(size, ret.MaxBytes):
		return 0, fmt.Errorf("ferry: write %s: %w: batch of %d messages, %d bytes exceeds retention", q.id, ferry.ErrMessageTooLarge, len(msgs), size)
	case len(msgs) == 0:
		return next, nil
	}
	r := &writeReq{msgs: msgs, size: size, try: try, done: make(chan writeRes, 1)}
	select {
	case q.reqs <- r:
	case <-q.stop:
		return 0, fmt.Errorf("ferry: write %s: %w", q.id, ferry.ErrClosed)
	case <-ctx.Done():
		return 0, fmt.Errorf("ferry: write %s: %w", q.id, ctx.Err())
	}
	select {
	case res := <-r.done:
		return res.first, res.err
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqPending, reqCanceled) {
			return 0, fmt.Errorf("ferry: write %s: %w", q.id, ctx.Err())
		}
		// The writer has the batch: it is all or nothing, wait for which.
		res := <-r.done
		return res.first, res.err
	}
}

func over(v, limit int64) bool { return limit != ferry.Unlimited && v > limit }

// atLeast reports whether v reaches a bound that is not Unlimited.
func atLeast(v, limit int64) bool { return limit != ferry.Unlimited && v >= limit }

// run is the writer goroutine: it owns appends, rolls, syncs and deletes.
func (q *queue) run() {
	defer q.wg.Done()
	var tick <-chan time.Time
	if q.cfg.sync.mode == syncEvery {
		t := time.NewTicker(q.cfg.sync.interval)
		defer t.Stop()
		tick = t.C
	}
	age := time.NewTimer(time.Hour)
	age.Stop()
	defer age.Stop()
	for {
		select {
		case r := <-q.reqs:
			q.pending = append(q.pending, r)
		drain:
			for len(q.pending) < 4096 {
				select {
				case r := <-q.reqs:
					q.pending = append(q.pending, r)
				default:
					break drain
				}
			}
		case <-q.kick:
		case <-age.C:
		case done := <-q.retainC:
			err := q.retain(time.Now())
			if err != nil {
				q.fail(err)
			}
			done <- err
			q.armAge(age)
			continue
		case <-tick:
			if q.dirty {
				q.syncActive()
			}
			continue
		case <-q.stop:
			for _, r := range q.pending {
				r.done <- writeRes{err: fmt.Errorf("ferry: write %s: %w", q.id, ferry.ErrClosed)}
			}
			q.pending = nil
			if q.dirty && q.cfg.sync.mode != syncNever {
				q.syncActive()
			}
			return
		}
		q.process()
		if err := q.retain(time.Now()); err != nil {
			q.fail(err)
		}
		q.armAge(age)
	}
}

// armAge sets the timer to the moment the oldest segment expires. It
// leaves the timer off when that moment has passed: the segment is then
// held by Block overflow until a Release, which wakes the writer.
func (q *queue) armAge(t *time.Timer) {
	q.mu.Lock()
	maxAge := q.ret.MaxAge
	q.mu.Unlock()
	if maxAge <= 0 {
		return
	}
	q.segMu.RLock()
	last := q.segs[0].lastTime
	q.segMu.RUnlock()
	if last == 0 {
		return
	}
	if d := time.Until(time.Unix(0, last).Add(maxAge)); d >= 0 {
		t.Reset(d + time.Millisecond)
	}
}

// process commits the pending writes that fit, in order.
func (q *queue) process() {
	q.pending = slices.DeleteFunc(q.pending, func(r *writeReq) bool {
		return r.state.Load() == reqCanceled
	})
	if len(q.pending) == 0 {
		return
	}
	q.mu.Lock()
	failed, ret := q.failed, q.ret
	q.mu.Unlock()
	if failed != nil {
		for _, r := range q.pending {
			if r.state.CompareAndSwap(reqPending, reqTaken) {
				r.done <- writeRes{err: fmt.Errorf("ferry: write %s: %w", q.id, failed)}
			}
		}
		q.pending = q.pending[:0]
		return
	}
	take := len(q.pending)
	if ret.Overflow == ferry.Block {
		take = q.fitting(ret)
		// Those that cannot wait are refused now.
		rest := q.pending[take:]
		q.pending = q.pending[:take]
		for _, r := range rest {
			if r.try && r.state.CompareAndSwap(reqPending, reqTaken) {
				r.done <- writeRes{err: fmt.Errorf("ferry: write %s: %w", q.id, ferry.ErrQueueFull)}
				continue
			}
			q.pending = append(q.pending, r)
		}
	}
	batch := make([]*writeReq, 0, take)
	for _, r := range q.pending[:take] {
		if r.state.CompareAndSwap(reqPending, reqTaken) {
			batch = append(batch, r)
		}
	}
	q.pending = slices.Delete(q.pending, 0, take)
	if len(batch) > 0 {
		q.commit(batch)
	}
}

// fitting returns how many of the pending writes, in order, fit a queue
// with Block overflow, dropping released segments to make room.
func (q *queue) fitting(ret ferry.Retention) int {
	count, bytes := q.retained()
	fits := func(n int) bool {
		var c, b int64
		for _, r := range q.pending[:n] {
			c += int64(len(r.msgs))
			b += r.size
		}
		return !over(count+c, ret.MaxMessages) && !over(bytes+b, ret.MaxBytes)
	}
	n := 0
	for n < len(q.pending) && fits(n+1) {
		n++
	}
	if n > 0 || len(q.pending) == 0 {
		return n
	}
	// Make room: seal the active segment if it is all released, then drop.
	q.mu.Lock()
	released := q.released
	q.mu.Unlock()
	q.segMu.RLock()
	act := q.segs[len(q.segs)-1]
	rollable := act.count() > 0 && act.next <= released
	q.segMu.RUnlock()
	if rollable {
		if err := q.roll(); err != nil {
			q.fail(err)
			return 0
		}
	}
	if err := q.retain(time.Now()); err != nil {
		q.fail(err)
		return 0
	}
	count, bytes = q.retained()
	for n < len(q.pending) && fits(n+1) {
		n++
	}
	return n
}

// retained returns the messages and bytes the queue holds.
func (q *queue) retained() (count, bytes int64) {
	q.segMu.RLock()
	defer q.segMu.RUnlock()
	for _, s := range q.segs {
		count += s.count()
		bytes += s.sizeSum
	}
	return count, bytes
}

// rollLimits returns the bounds at which a segment stops taking messages:
// an eighth of each retention bound, so retention, which deletes whole
// segments, stays within an eighth of them.
func (q *queue) rollLimits(ret ferry.Retention) (count, bytes int64, age time.Duration) {
	count, bytes = -1, -1
	if ret.MaxMessages != ferry.Unlimited {
		count = max(1, ret.MaxMessages/8)
	}
	if ret.MaxBytes != ferry.Unlimited {
		bytes = max(1, ret.MaxBytes/8)
	}
	if ret.MaxAge > 0 {
		age = max(time.Millisecond, ret.MaxAge/8)
	}
	return count, bytes, age
}

// commit writes batch: offsets, one write per segment touched, one
// fdatasync with SyncAlways, then publishes and acknowledges.
func (q *queue) commit(batch []*writeReq) {
	now := time.Now()
	q.mu.Lock()
	first, ret := q.next, q.ret
	q.mu.Unlock()
	rollCount, rollBytes, rollAge := q.rollLimits(ret)

	off := first
	q.enc, q.ends = q.enc[:0], q.ends[:0]
	var msgs []*ferry.EnhancedMessage
	for _, r := range batch {
		for _, m := range r.msgs {
			m.Queue = q.id.Queue
			m.Offset = off
			m.StoreTime = now
			off++
			q.enc = ferry.AppendEncode(q.enc, m)
			q.ends = append(q.ends, len(q.enc))
			msgs = append(msgs, m)
		}
	}

	type undo struct {
		s    *segment
		size int64
	}
	var touched []undo
	fail := func(err error) {
		for _, u := range touched {
			_ = u.s.f.Truncate(u.size)
		}
		q.fail(err)
		for _, r := range batch {
			r.done <- writeRes{err: fmt.Errorf("ferry: write %s: %w", q.id, q.failedErr())}
		}
	}

	i := 0
	for i < len(msgs) {
		q.segMu.RLock()
		act := q.segs[len(q.segs)-1]
		cnt, size, sum, firstTime := act.count(), act.size, act.sizeSum, act.firstTime
		q.segMu.RUnlock()
		accepts := func(m *ferry.EnhancedMessage, encLen int) bool {
			if cnt == 0 {
				return true
			}
			return size+int64(encLen)+frameHeader <= q.cfg.segmentBytes &&
				(rollCount < 0 || cnt+1 <= rollCount) &&
				(rollBytes < 0 || sum+int64(m.Size()) <= rollBytes) &&
				(rollAge == 0 || now.Sub(time.Unix(0, firstTime)) < rollAge)
		}
		encStart := func(j int) int {
			if j == 0 {
				return 0
			}
			return q.ends[j-1]
		}
		if !accepts(msgs[i], q.ends[i]-encStart(i)) {
			if err := q.roll(); err != nil {
				fail(err)
				return
			}
			continue
		}
		// Frames for this segment.
		q.out = q.out[:0]
		var frames []frameInfo
		for i < len(msgs) {
			j, fsum := i, int64(0)
			for j < len(msgs) {
				m, l := msgs[j], q.ends[j]-encStart(j)
				if j > i && q.ends[j]-encStart(i)+frameHeader > q.cfg.maxFrameBytes {
					break
				}
				if !accepts(m, l) {
					break
				}
				cnt++
				size += int64(l)
				if j == i {
					size += frameHeader
				}
				sum += int64(m.Size())
				fsum += int64(m.Size())
				j++
			}
			if j == i {
				break
			}
			start := len(q.out)
			q.out = appendFrame(q.out, msgs[i].Offset, j-i, now.UnixNano(), fsum, q.enc[encStart(i):q.ends[j-1]])
			frames = append(frames, frameInfo{base: msgs[i].Offset, count: j - i, time: now.UnixNano(), sizeSum: fsum, totalLen: len(q.out) - start})
			if firstTime == 0 {
				firstTime = now.UnixNano()
			}
			i = j
		}
		q.segMu.RLock()
		at := act.size
		q.segMu.RUnlock()
		touched = append(touched, undo{act, at})
		if _, err := act.f.WriteAt(q.out, at); err != nil {
			fail(err)
			return
		}
		q.dirty = true
		q.segMu.Lock()
		for _, fi := range frames {
			act.add(fi, q.cfg.indexInterval)
		}
		q.segMu.Unlock()
	}
	if q.cfg.sync.mode == syncAlways {
		if err := q.syncActive(); err != nil {
			fail(err)
			return
		}
	}

	// Publish.
	q.mu.Lock()
	q.next = off
	if q.cfg.cacheMessages > 0 {
		for _, m := range msgs {
			q.cache = append(q.cache, m)
			q.cacheBytes += int64(m.Size())
		}
		q.trimCache(q.oldest)
	} else {
		q.cacheBase = off
	}
	q.wakeReaders()
	q.mu.Unlock()
	// Retention before the acknowledgement, so a writer sees its bounds
	// kept when Write returns. A failed delete fails later writes; these
	// are on disk.
	if err := q.retain(now); err != nil {
		q.fail(err)
	}
	for _, r := range batch {
		r.done <- writeRes{first: r.msgs[0].Offset}
	}
	if cap(q.enc) > 16<<20 { // do not hold on to the buffers of a huge batch
		q.enc, q.out = nil, nil
	}
}

// trimCache keeps the cache within its bounds and at or above oldest.
// q.mu must be held.
func (q *queue) trimCache(oldest int64) {
	for q.cacheHead < len(q.cache) {
		live := len(q.cache) - q.cacheHead
		if q.cacheBase >= oldest && live <= q.cfg.cacheMessages && q.cacheBytes <= q.cfg.cacheBytes {
			break
		}
		q.cacheBytes -= int64(q.cache[q.cacheHead].Size())
		q.cache[q.cacheHead] = nil
		q.cacheHead++
		q.cacheBase++
	}
	if q.cacheHead == len(q.cache) {
		q.cache, q.cacheHead, q.cacheBase = q.cache[:0], 0, max(q.next, oldest)
	} else if q.cacheHead > len(q.cache)/2 {
		n := copy(q.cache, q.cache[q.cacheHead:])
		clear(q.cache[n:])
		q.cache, q.cacheHead = q.cache[:n], 0
	}
}

// syncActive fdatasyncs the active segment.
func (q *queue) syncActive() error {
	q.segMu.RLock()
	act := q.segs[len(q.segs)-1]
	q.segMu.RUnlock()
	q.dirty = false
	if err := syncFile(act.f); err != nil {
		q.fail(err)
		return err
	}
	return nil
}

// fail makes the queue fail every later write.
func (q *queue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.failed == nil {
		q.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		q.st.cfg.log.Error("ferry: filestore: queue failed", "queue", q.id.String(), "err", err)
	}
}

func (q *queue) failedErr() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}

// roll seals the active segment (fdatasync unless SyncNever, index file)
// and starts a new one.
func (q *queue) roll() error {
	q.segMu.RLock()
	old := q.segs[len(q.segs)-1]
	idx := encodeIndex(old)
	base := old.next
	q.segMu.RUnlock()
	if q.cfg.sync.mode != syncNever {
		if err := syncFile(old.f); err != nil {
			return err
		}
		q.dirty = false
	}
	root := q.st.root
	iname := indexName(q.dir, old.base)
	if err := writeFileRename(root, iname, idx, false); err != nil {
		return err
	}
	name := segmentName(q.dir, base)
	f, err := root.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := syncDir(root, q.dir); err != nil {
		_ = f.Close()
		return err
	}
	q.segMu.Lock()
	q.segs = append(q.segs, &segment{name: name, f: f, base: base, next: base})
	q.segMu.Unlock()
	return nil
}

// retain deletes the oldest sealed segments that retention lets go: with
// DropOldest, those whose messages all expired, and those the queue is over
// its bounds without (so a queue keeps at least its bounds, Kafka's rule);
// with Block, segments wholly released when a write waits for room or
// their messages expired. It seals an active segment whose messages all
// expired, so that it can go too.
func (q *queue) retain(now time.Time) error {
	q.mu.Lock()
	ret, released, failed := q.ret, q.released, q.failed
	q.mu.Unlock()
	if failed != nil {
		return nil
	}
	if ret.MaxAge > 0 {
		q.segMu.RLock()
		act := q.segs[len(q.segs)-1]
		expired := act.count() > 0 && now.Sub(time.Unix(0, act.lastTime)) > ret.MaxAge &&
			(ret.Overflow != ferry.Block || act.next <= released)
		q.segMu.RUnlock()
		if expired {
			if err := q.roll(); err != nil {
				return err
			}
		}
	}
	q.segMu.Lock()
	var count, bytes int64
	for _, s := range q.segs {
		count += s.count()
		bytes += s.sizeSum
	}
	n := 0
	for n < len(q.segs)-1 {
		s := q.segs[n]
		if ret.Overflow == ferry.Block && s.next > released {
			break
		}
		old := ret.MaxAge > 0 && s.lastTime != 0 && now.Sub(time.Unix(0, s.lastTime)) > ret.MaxAge
		var drop bool
		if ret.Overflow == ferry.Block {
			drop = old || len(q.pending) > 0
		} else {
			drop = old || atLeast(count-s.count(), ret.MaxMessages) || atLeast(bytes-s.sizeSum, ret.MaxBytes)
		}
		if !drop {
			break
		}
		count -= s.count()
		bytes -= s.sizeSum
		n++
	}
	drop := slices.Clone(q.segs[:n])
	q.segs = slices.Delete(q.segs, 0, n)
	oldest := q.segs[0].base
	q.segMu.Unlock()
	if n == 0 {
		return nil
	}
	q.mu.Lock()
	q.oldest = oldest
	q.trimCache(oldest)
	q.mu.Unlock()
	var errs []error
	for _, s := range drop {
		errs = append(errs, s.f.Close())
		errs = append(errs, q.st.root.Remove(s.name))
		if err := q.st.root.Remove(indexName(q.dir, s.base)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, syncDir(q.st.root, q.dir))
	return errors.Join(errs...)
}

// wakeReaders wakes every blocked reader. q.mu must be held.
func (q *queue) wakeReaders() {
	for _, ch := range q.readers {
		ch <- struct{}{} // capacity 1, and each reader is listed once
	}
	clear(q.readers)
	q.readers = q.readers[:0]
}

// Release implements [ferry.Releaser]: with [ferry.Block] overflow,
// segments wholly below offset may be deleted to make room.
func (q *queue) Release(offset int64) {
	q.mu.Lock()
	q.released = max(q.released, offset)
	q.mu.Unlock()
	q.poke()
}

// Offsets implements [ferry.ReadableQueue].
func (q *queue) Offsets() (oldest, next int64) {
	q.expire()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.oldest, q.next
}

// expire runs a retention pass in the writer goroutine when the oldest
// segment has outlived the age bound, so an idle queue's Offsets and Read
// see expired messages gone.
func (q *queue) expire() {
	q.mu.Lock()
	ret, released, closed := q.ret, q.released, q.closed
	q.mu.Unlock()
	if ret.MaxAge <= 0 || closed {
		return
	}
	q.segMu.RLock()
	last, held := q.segs[0].lastTime, ret.Overflow == ferry.Block && q.segs[0].next > released
	q.segMu.RUnlock()
	if last == 0 || held || time.Since(time.Unix(0, last)) <= ret.MaxAge {
		return
	}
	done := make(chan error, 1)
	select {
	case q.retainC <- done:
		<-done
	case <-q.stop:
	}
}

// Read implements [ferry.ReadableQueue]. Recent messages come from the
// cache, shared with every reader; older ones are decoded from disk.
func (q *queue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	q.expire()
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return 0, fmt.Errorf("ferry: read %s: %w", q.id, ferry.ErrClosed)
		}
		if offset < q.oldest || offset > q.next {
			oldest, next := q.oldest, q.next
			q.mu.Unlock()
			return 0, fmt.Errorf("ferry: read %s at %d: %w: retained [%d, %d)", q.id, offset, ferry.ErrOffsetOutOfRange, oldest, next)
		}
		if offset < q.next {
			if offset >= q.cacheBase {
				n := copy(dst, q.cache[q.cacheHead+int(offset-q.cacheBase):])
				q.mu.Unlock()
				return n, nil
			}
			limit := q.next
			q.mu.Unlock()
			n, err := q.readDisk(offset, limit, dst)
			if err != nil {
				return 0, fmt.Errorf("ferry: read %s at %d: %w", q.id, offset, err)
			}
			return n, nil
		}
		if err := ctx.Err(); err != nil {
			q.mu.Unlock()
			return 0, fmt.Errorf("ferry: read %s: %w", q.id, err)
		}
		ch := make(chan struct{}, 1)
		q.readers = append(q.readers, ch)
		q.mu.Unlock()
		select {
		case <-ch:
			q.mu.Lock()
		case <-ctx.Done():
			q.mu.Lock()
			if i := slices.Index(q.readers, ch); i >= 0 {
				q.readers = slices.Delete(q.readers, i, i+1)
			}
			q.mu.Unlock()
			return 0, fmt.Errorf("ferry: read %s: %w", q.id, ctx.Err())
		}
	}
}

// readDisk decodes messages from offset (below limit) into dst from the
// segment that holds offset.
func (q *queue) readDisk(offset, limit int64, dst []*ferry.EnhancedMessage) (int, error) {
	q.segMu.RLock()
	defer q.segMu.RUnlock()
	if q.segsClosed {
		return 0, ferry.ErrClosed
	}
	i := sortSearchSegs(q.segs, offset)
	if i < 0 {
		return 0, fmt.Errorf("%w: retained from %d", ferry.ErrOffsetOutOfRange, q.segs[0].base)
	}
	s := q.segs[i]
	e := s.lookup(offset)
	sc := newFrameScanner(s.f, e.pos, s.size, q.cfg.maxFrameBytes)
	sc.bufSize = 64 << 10
	want := e.off
	out := dst[:0]
	for len(out) < len(dst) {
		pos := sc.pos()
		fi, enc, err := sc.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, fmt.Errorf("%w (%s at byte %d)", err, s.name, pos)
		}
		if fi.base != want {
			return 0, fmt.Errorf("%w: frame holds offset %d, want %d (%s at byte %d)", ferry.ErrCorrupt, fi.base, want, s.name, pos)
		}
		want = fi.next()
		if want <= offset {
			continue
		}
		var msgs []*ferry.EnhancedMessage
		msgs, err = decodeMessages(msgs, fi, enc, offset)
		if err != nil {
			return 0, fmt.Errorf("%w (%s at byte %d)", err, s.name, pos)
		}
		for _, m := range msgs {
			if m.Offset >= limit || len(out) == len(dst) {
				break
			}
			out = append(out, m)
		}
		if want >= limit {
			break
		}
	}
	if len(out) == 0 {
		return 0, fmt.Errorf("%w: offset %d not found in %s", ferry.ErrCorrupt, offset, s.name)
	}
	return len(out), nil
}

// sortSearchSegs returns the index of the segment holding offset, or -1.
func sortSearchSegs(segs []*segment, offset int64) int {
	i, found := slices.BinarySearchFunc(segs, offset, func(s *segment, off int64) int {
		switch {
		case off < s.base:
			return 1
		case off >= s.next:
			return -1
		}
		return 0
	})
	if !found {
		return -1
	}
	return i
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
	q.wakeReaders()
	q.mu.Unlock()
	close(q.stop)
	q.wg.Wait()
	q.segMu.Lock()
	var errs []error
	for _, s := range q.segs {
		errs = append(errs, s.f.Close())
	}
	q.segsClosed = true
	q.segMu.Unlock()
	q.mu.Lock()
	q.cache, q.cacheHead, q.cacheBase = nil, 0, q.next
	if q.failed != nil {
		errs = append(errs, q.failed)
	}
	q.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		q.closeEr = fmt.Errorf("ferry: close %s: %w", q.id, err)
	}
	q.st.forget(q)
	return q.closeEr
}
