package ferry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxFetchBatch bounds the messages one Read fetches; a fetch loop
// starts with room for minFetchBatch and doubles it each time a Read
// fills it, so an idle queue's loop holds 128 bytes, not 2 KiB (10,000
// idle consumers: 20 MB).
const (
	maxFetchBatch = 256
	minFetchBatch = 16
)

// readErrorBackoff is the wait before a fetch retries after a read error
// other than a reset (a disk error, say).
const readErrorBackoff = time.Second

// queueRun is the member's hold on one queue: lock, cursor, fetch loop,
// buffer. It lives from the take to the release.
type queueRun struct {
	m     *groupMember
	q     int
	id    QueueID
	t     *topicState // the topic as the run was made (the queue's index is in it)
	queue Queue
	sess  Session // the session the run locks its queue in
	lease Lease   // set once locked, before owned
	// deadline is the lease when it can expire by the clock (see
	// DeadlineLease); nil otherwise. Set with lease.
	deadline DeadlineLease
	buf      *Buffer

	ctx    context.Context // fetch context; cancelled to release
	cancel context.CancelFunc
	// hctx is the context handlers run under; cancelled when the drain
	// timeout gives up on them.
	hctx    context.Context
	hcancel context.CancelFunc
	ready   chan struct{} // closed once the queue is taken (or the take gave up)
	done    chan struct{} // closed when the run has released the queue

	owned     atomic.Bool // lock held and cursor loaded
	dropped   atomic.Bool // revoked by a rebalance: the member does not take it again when it ends
	releasing atomic.Bool // revoked: no take from the buffer, no retry starts
	finished  atomic.Bool // drained (or the drain gave up): no handling starts
	lost      atomic.Bool // the lease was lost (or fenced): no commit from now on
	paused    atomic.Bool // no fetch and no take until resumed (see Consumer.Pause)
	seeking   atomic.Bool // a seek waits for the in-flight messages: no take
	// seeks carries Consumer.Seek's requests to the fetch loop; fcancel
	// cancels the fetch loop's current Read or Put so that it takes one.
	seeks   chan seekReq
	fetchMu sync.Mutex // guards fcancel
	fcancel context.CancelFunc

	// The fetch loop runs only while there is something to fetch: parked
	// (at the end of a queue that can wake it, see readParker, or
	// paused), it has no goroutine. kicks counts the wake-ups since its
	// goroutine last checked: the one that moves it from 0 starts one.
	// Its state lives here between goroutines.
	kicks   atomic.Int64
	waiter  readWaiter
	scratch []*EnhancedMessage
	limit   int
	// unsignaled: the loop listed the run with the scheduler without
	// waking a taker (see fetch).
	unsignaled bool
	fctx       context.Context
	readied    atomic.Bool // ready is closed, or about to be (see markReady)
	stopWatch  func()      // stops watching the lease

	inReady bool // guarded by m.sched.mu

	cslot     *cursorSlot // the queue's cursor, when the store is a MemoryCursorStore
	commitMu  sync.Mutex  // guards committed and released
	committed int64
	released  bool
}

func (m *groupMember) newRun(q int, sess Session) *queueRun {
	r := &queueRun{
		m: m, q: q, id: QueueID{Topic: m.topic, Queue: q}, t: m.view.Load().t, sess: sess,
		buf:   newBuffer(m.cfg.buffer),
		seeks: make(chan seekReq, 1),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	r.queue = r.t.queues[q]
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.hctx, r.hcancel = context.WithCancel(context.Background())
	r.committed = -1
	r.kicks.Store(noKick) // until the fetch loop starts
	m.b.urgent.Add(1)     // until the queue is taken, or the take gives up
	return r
}

// runTask runs the fetch loop's turn on a runner (see kick).
func (r *queueRun) runTask() { r.fetchLoop() }

// markReady closes ready, once.
func (r *queueRun) markReady() {
	if r.readied.CompareAndSwap(false, true) {
		r.m.b.urgent.Add(-1)
		close(r.ready)
	}
}

// run takes the queue (waiting for its lock) and starts fetching; the
// fetch loop releases it.
func (r *queueRun) run() {
	m := r.m
	lease, err := r.sess.Lock(r.ctx, r.q)
	if err != nil {
		if r.ctx.Err() == nil && !errors.Is(err, ErrSessionExpired) {
			m.report(&Error{Op: fmt.Sprintf("lock %s", r.id), Err: err})
			// The member takes the queue again (see runEnded), after a
			// pause so that a lock that keeps failing is not a busy loop.
			t := time.NewTimer(relockBackoff)
			select {
			case <-t.C:
			case <-r.ctx.Done():
			}
			t.Stop()
		}
		r.finished.Store(true)
		r.end(false)
		return
	}
	r.taken(lease)
}

// taken holds the queue's lease: it loads the cursor and starts the
// fetch loop. It does not block (for long: a cursor load), so the member
// calls it in its own goroutine when it got the lock at once (see
// groupMember.startRun).
func (r *queueRun) taken(lease Lease) {
	m := r.m
	r.lease = lease
	r.deadline, _ = lease.(DeadlineLease)
	r.stopWatch = r.watchLost()
	start, err := r.load()
	if err != nil {
		if r.ctx.Err() == nil {
			m.report(err)
		}
		r.finished.Store(true)
		// The run gives the queue back after a pause, and the member
		// takes it again (see runEnded): a cursor store that failed for
		// a moment (its leader being elected, say) must not leave the
		// queue locked and idle until the next rebalance.
		go func() {
			t := time.NewTimer(relockBackoff)
			select {
			case <-t.C:
			case <-r.ctx.Done():
			}
			t.Stop()
			r.end(true)
		}()
		return
	}
	r.buf.Reset(start)
	r.owned.Store(true)
	r.callback("assigned", m.cfg.onAssigned)
	m.hooks.onRebalanced(m.scope, m.cfg.memberID, r.id, true)
	r.markReady()
	r.limit = min(maxFetchBatch, max(1, r.buf.highMsgs))
	r.scratch = make([]*EnhancedMessage, min(minFetchBatch, r.limit))
	r.waiter.kicker = r
	// The caller is the fetch loop: what kicked before (a revoke, say) is
	// seen below.
	r.kicks.Store(1)
	// At the end of a queue that wakes it, the loop parks at once: no
	// goroutine is started for an idle queue.
	if p, ok := r.queue.(readParker); ok {
		n := r.kicks.Load()
		if len(r.seeks) == 0 && r.ctx.Err() == nil && !r.paused.Load() && p.park(r.buf.Next(), &r.waiter) && r.kicks.CompareAndSwap(n, 0) {
			return
		}
	}
	r.m.b.runners.run(r)
}

// kick wakes the fetch loop: it starts a goroutine for it if it is
// parked. It neither blocks nor calls the queue (see readWaiter).
func (r *queueRun) kick() {
	if r.kicks.Add(1) == 1 {
		r.m.b.runners.run(r)
	}
}

// noKick is the value of a kick counter while no kick may start a
// goroutine: before the loop starts, and once it has ended. A kick adds to
// it, which leaves it far from 1.
const noKick = 1 << 62

// fetchLoop runs the fetch loop until it parks with no kick since its
// last check, or until the run is released, which it completes.
func (r *queueRun) fetchLoop() {
	for {
		n := r.kicks.Load()
		if r.fetch() {
			r.kicks.Store(noKick)
			r.signal()
			r.finish()
			return
		}
		unsignaled := r.unsignaled // read while the loop's state is this goroutine's
		r.unsignaled = false
		if r.kicks.CompareAndSwap(n, 0) {
			// Parked: the next kick starts another goroutine. This one
			// handles what it fetched, if a worker may start.
			if unsignaled {
				r.m.sched.handOff()
			}
			return
		}
		r.unsignaled = unsignaled
	}
}

// signal wakes a taker for what the fetch loop listed quietly.
func (r *queueRun) signal() {
	if r.unsignaled {
		r.unsignaled = false
		r.m.sched.signal()
	}
}

// finish releases the queue once the fetch loop has stopped.
func (r *queueRun) finish() {
	m := r.m
	if p, ok := r.queue.(readParker); ok {
		p.unpark(&r.waiter)
	}
	r.release()
	r.callback("revoked", m.cfg.onRevoked)
	m.hooks.onRebalanced(m.scope, m.cfg.memberID, r.id, false)
	r.end(true)
}

// end ends the run: it unlocks the queue (if locked) and tells the member.
func (r *queueRun) end(locked bool) {
	if locked {
		r.stopWatch()
		r.unlock()
	}
	r.markReady()
	r.hcancel()
	close(r.done)
	r.m.runEnded(r)
	r.m.wg.Done()
}

// callback calls f (a rebalance callback) with the queue, reporting a
// panic.
func (r *queueRun) callback(name string, f func(QueueID)) {
	if f == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			r.m.report(&Error{Op: fmt.Sprintf("on %s %s", name, r.id), Err: fmt.Errorf("panic: %v", p)})
		}
	}()
	f(r.id)
}

// watchLost makes the run lose the queue when its lease is lost, and
// returns what stops watching. The leases of this package need no
// goroutine for it; others get one, which the returned func waits for.
func (r *queueRun) watchLost() func() {
	if n, ok := r.lease.(lostNotifier); ok {
		if !n.afterLost(r.lose) {
			r.lose()
		}
		return func() {}
	}
	exit := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-r.lease.Lost():
			r.lose()
		case <-exit:
		}
	}()
	return func() { close(exit); <-watched }
}

// lose is the loss of the lease (or a fenced commit): the run stops at
// once, cancels its handlers, and commits nothing more, since its token
// is stale. What was in flight goes to the next owner.
func (r *queueRun) lose() {
	if r.lost.Swap(true) {
		return
	}
	r.revoke()
	r.finished.Store(true)
	r.hcancel()
	r.m.b.log.Warn("ferry: queue lease lost", "group", r.m.scope, "queue", r.id.String(), "member", r.m.cfg.memberID)
}

// unlockTimeout bounds the Release of a lease.
const unlockTimeout = 10 * time.Second

// unlock releases the lease, reporting a failure.
func (r *queueRun) unlock() {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	if err := r.lease.Release(ctx); err != nil && !r.lost.Load() {
		r.m.report(&Error{Op: fmt.Sprintf("unlock %s", r.id), Err: err})
	}
}

// commitCursor commits off for r's queue, fenced by the lease's token
// when the store can; ErrFenced loses the queue.
func (r *queueRun) commitCursor(ctx context.Context, off int64) error {
	m := r.m
	var err error
	if r.cslot != nil {
		err = r.cslot.commit(off, r.lease.Token())
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
	} else if fs, ok := m.b.cursors.(FencedCursorStore); ok {
		err = fs.CommitFenced(ctx, m.topic, m.scope, r.q, off, r.lease.Token())
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
	} else {
		err = m.b.cursors.Commit(ctx, m.topic, m.scope, r.q, off)
	}
	return err
}

// load reads the committed cursor, picks the start offset (WithStartFrom
// without a cursor, a reset outside the retained range) and commits it.
func (r *queueRun) load() (int64, error) {
	m := r.m
	offs, err := m.b.cursors.Load(r.ctx, m.topic, m.scope, len(r.t.queues))
	if err != nil {
		return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
	}
	if _, listed := m.b.cursors.(CursorGroups); !listed || r.t.meta.Retention.Overflow == Block {
		// Block queues' releases, and ForgetGroup over a store that
		// cannot list its groups, need to know the group reads the topic.
		m.b.groups.register(m.topic, m.scope, offs)
	}
	if ms, ok := m.b.cursors.(*MemoryCursorStore); ok {
		r.cslot = ms.slot(m.topic, m.scope, r.q)
	}
	cur := offs[r.q]
	oldest, next, err := queueOffsets(r.ctx, r.queue)
	if err != nil {
		return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
	}
	start := cur
	switch {
	case cur < 0 && m.cfg.startFrom == Latest:
		start = next
	case cur < 0:
		start = oldest
	case cur < oldest || cur > next:
		start = r.resetTo(cur, oldest, next)
	}
	if start != cur {
		began := time.Now()
		err := r.commitCursor(r.ctx, start)
		m.recordCommit(time.Since(began))
		if err != nil {
			return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
		}
	}
	r.commitMu.Lock()
	r.committed = start
	r.commitMu.Unlock()
	r.releaseBlocked(start)
	return start, nil
}

// resetTo returns where a consumer at offset from, outside the retained
// range [oldest, next], goes on, and reports the reset.
func (r *queueRun) resetTo(from, oldest, next int64) int64 {
	to := oldest
	if from > next {
		to = next
	}
	m := r.m
	m.b.log.Warn("ferry: cursor reset", "group", m.scope, "queue", r.id.String(), "from", from, "to", to)
	if m.cfg.onReset != nil {
		m.cfg.onReset(r.id, from, to)
	}
	m.hooks.onReset(m.scope, r.id, from, to)
	return to
}

// fetch reads batches from the queue into the buffer until released
// (true) or parked (false: paused, or at the end of a queue that wakes it
// with a kick).
func (r *queueRun) fetch() bool {
	m := r.m
	for {
		select {
		case req := <-r.seeks:
			r.signal() // the seek waits for what is listed to be handled
			r.seek(req)
			r.dropFetchCtx()
			continue
		default:
		}
		if r.ctx.Err() != nil {
			return true
		}
		if r.paused.Load() {
			return false // setPaused(false), a seek or the release kicks it
		}
		scratch := r.scratch
		next := r.buf.Next()
		rctx := r.ctx // a read that does not block needs no seek to interrupt it
		if p, ok := r.queue.(readParker); !ok {
			r.signal() // Read may block: a worker handles what the loop listed
			rctx = r.fetchCtx()
		} else if p.park(next, &r.waiter) {
			return false // the next write kicks it
		}
		n, err := r.queue.Read(rctx, next, scratch)
		if err == nil {
			err = checkRead(r.queue, next, scratch, n)
		}
		if err != nil {
			switch {
			case r.ctx.Err() != nil:
				return true
			case r.fctx != nil && r.fctx.Err() != nil:
				continue // a seek: the loop takes it
			case errors.Is(err, ErrOffsetOutOfRange):
				oldest, end, oerr := queueOffsets(r.ctx, r.queue)
				if oerr == nil {
					to := r.resetTo(next, oldest, end)
					if to < next {
						r.buf.Reset(to)
					} else {
						r.buf.Advance(to)
					}
					m.markDirty()
					continue
				}
				err = oerr
			case errors.Is(err, ErrClosed):
				r.signal()
				<-r.ctx.Done() // the broker is closing; it closes us too
				return true
			}
			r.signal()
			m.report(&Error{Op: fmt.Sprintf("fetch %s", r.id), Err: err})
			t := time.NewTimer(readErrorBackoff)
			select {
			case <-t.C:
			case <-r.ctx.Done():
				t.Stop()
				return true
			}
			continue
		}
		batch := scratch[:n]
		last := batch[n-1].Offset
		if m.tags != nil {
			kept := batch[:0]
			for _, msg := range batch {
				if _, ok := m.tags[msg.Tag]; ok {
					kept = append(kept, msg)
				}
			}
			batch = kept
		}
		seeked := false
		for len(batch) > 0 {
			k, waits, err := r.buf.put(r.ctx, batch, false)
			if waits {
				r.signal() // Put waits for room: a worker must make it
				k, err = r.buf.Put(r.fetchCtx(), batch)
			}
			switch {
			case k == len(batch) && m.sched.inline != nil:
				// Listed quietly: as the loop parks, its goroutine
				// handles them (see fetchLoop), or it wakes a worker
				// before it blocks (see signal).
				m.sched.list(r)
				r.unsignaled = true
			case k > 0:
				m.sched.push(r)
			}
			if err != nil && r.ctx.Err() == nil && r.fctx != nil && r.fctx.Err() != nil {
				seeked = true // a seek while the buffer was full: the rest goes
				break
			}
			if err != nil {
				clear(scratch)
				return true // released while paused
			}
			batch = batch[k:]
		}
		if seeked {
			clear(scratch[:n])
			continue
		}
		if r.buf.advance(last + 1) {
			m.markDirty() // all filtered out: the cursor moves without a handler
		}
		clear(scratch[:n])
		if n == len(scratch) && n < r.limit { // a backlog: read more at a time
			r.scratch = make([]*EnhancedMessage, min(2*n, r.limit))
		}
	}
}

// seekReq asks a run's fetch loop to move to offset to.
type seekReq struct {
	to   int64
	done chan error // gets the outcome
}

// fetchCtx returns the context of the fetch loop's reads and puts that
// may block, which a seek cancels; it is made when first needed (a memory
// queue's loop never blocks in Read, and in Put only when the buffer is
// full).
func (r *queueRun) fetchCtx() context.Context {
	if r.fctx == nil {
		r.fctx = r.fetchContext()
	}
	return r.fctx
}

// dropFetchCtx lets the fetch context go (a seek cancelled it): the next
// blocking read or put makes another.
func (r *queueRun) dropFetchCtx() {
	r.fetchMu.Lock()
	if r.fcancel != nil {
		r.fcancel()
		r.fcancel = nil
	}
	r.fetchMu.Unlock()
	r.fctx = nil
}

// fetchContext returns a new context for the fetch loop's reads and puts,
// which a seek cancels.
func (r *queueRun) fetchContext() context.Context {
	ctx, cancel := context.WithCancel(r.ctx)
	r.fetchMu.Lock()
	if r.fcancel != nil {
		r.fcancel()
	}
	r.fcancel = cancel
	r.fetchMu.Unlock()
	return ctx
}

// requestSeek hands req to the fetch loop and wakes it; false if the run
// ended (or ctx did) first.
func (r *queueRun) requestSeek(ctx context.Context, req seekReq) bool {
	select {
	case r.seeks <- req:
	case <-r.done:
		return false
	case <-ctx.Done():
		return false
	}
	r.fetchMu.Lock()
	if r.fcancel != nil {
		r.fcancel()
	}
	r.fetchMu.Unlock()
	r.kick()
	return true
}

// seek moves the run to req.to, in the fetch loop: no message is handed
// out meanwhile, the messages in flight finish first (a pull consumer's
// polled ones are let go: their later Commit is ignored), the buffered
// rest is dropped, and the cursor is committed at req.to.
func (r *queueRun) seek(req seekReq) {
	r.seeking.Store(true)
	defer func() {
		r.seeking.Store(false)
		if r.buf.Pending() > 0 {
			r.m.sched.push(r)
		}
	}()
	if !r.m.pull {
		if err := r.buf.WaitDrained(r.ctx); err != nil {
			req.done <- ErrClosed
			return
		}
	}
	r.buf.Reset(req.to)
	r.commitMu.Lock()
	err := r.commitCursor(r.ctx, req.to)
	if err == nil {
		r.committed = req.to
	}
	r.commitMu.Unlock()
	if err == nil {
		r.m.b.groups.invalidate(r.m.topic) // a Block release must see the cursor moved back
		r.m.b.log.Info("ferry: seek", "group", r.m.scope, "queue", r.id.String(), "to", req.to)
	}
	req.done <- err
}

// checkRead checks what q's Read at next returned in dst[:n]: at least
// one message and no more than dst holds, none nil, offsets increasing
// from next. A queue that breaks the contract is named, and its read
// handled as a failed one, rather than crash the fetch loop.
func checkRead(q Queue, next int64, dst []*EnhancedMessage, n int) error {
	if n < 1 || n > len(dst) {
		return &Error{Op: fmt.Sprintf("queue %T read", q), Err: fmt.Errorf("%w: %d messages into %d", ErrInvalidMessage, n, len(dst))}
	}
	want := next
	for i, m := range dst[:n] {
		if m == nil || m.Offset < want {
			clear(dst[:n])
			if m == nil {
				return &Error{Op: fmt.Sprintf("queue %T read at %d: message %d", q, next, i), Err: fmt.Errorf("%w: nil", ErrInvalidMessage)}
			}
			return &Error{Op: fmt.Sprintf("queue %T read at %d", q, next), Err: fmt.Errorf("%w: message %d has offset %d, want %d or more", ErrInvalidMessage, i, m.Offset, want)}
		}
		want = m.Offset + 1
	}
	return nil
}

// setPaused pauses or resumes the run: a paused run fetches nothing more
// and hands none of its pending messages out; what is in flight goes on.
func (r *queueRun) setPaused(p bool) {
	if r.paused.Swap(p) == p || p {
		return
	}
	r.kick()
	if r.buf.Pending() > 0 {
		r.m.sched.push(r)
	}
}

// admits reports whether a take of r's messages may start: not once the
// queue is revoked (releasing), and not while it is paused or a seek
// waits for what is in flight. A worker's take from the scheduler and
// each take of an ordered run check it.
func (r *queueRun) admits() bool {
	return !r.releasing.Load() && !r.paused.Load() && !r.seeking.Load() && !r.pastDeadline()
}

// pastDeadline reports whether r's lease may have expired by this
// process's clock (see DeadlineLease), though Lost may not be closed yet.
func (r *queueRun) pastDeadline() bool {
	if r.deadline == nil {
		return false
	}
	d, ok := r.deadline.Deadline()
	return ok && !time.Now().Before(d)
}

// expired reports whether r's lease may have expired, and then loses the
// queue at once (see lose), without waiting for Lost: every handling,
// retry and take checks it before it starts. Not under the scheduler's
// lock (lose revokes the run).
func (r *queueRun) expired() bool {
	if !r.pastDeadline() {
		return false
	}
	r.lose()
	return true
}

// revoke stops intake at once, before the run drains: no message is taken
// from the buffer and no handling or retry of one starts after it (the
// unstarted rest of a taken batch goes back, unfinished), so nothing can
// overtake a message left unfinished; then the fetch loop stops and the
// run releases the queue.
func (r *queueRun) revoke() {
	r.releasing.Store(true)
	r.buf.Close()
	r.cancel()
	r.kick() // a parked fetch loop must release
}

// release stops takes, waits for the in-flight messages up to the drain
// timeout, commits and marks the run finished. The caller unlocks.
func (r *queueRun) release() {
	m := r.m
	r.releasing.Store(true)
	r.buf.Close() // no take after this: the drain below is final
	if m.dropRetries != nil {
		m.dropRetries(r) // a retry's backoff must not hold the release
	}
	timeout := m.cfg.drainTimeout
	if m.pull && m.closing() || r.lost.Load() {
		timeout = 0 // nothing in flight can finish: Commit is refused after Close, or the lease is gone
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err := r.buf.WaitDrained(ctx)
	cancel()
	r.finished.Store(true) // no handling starts after the drain
	if err != nil && timeout > 0 && !r.lost.Load() {
		st := r.buf.Stats()
		m.b.log.Warn("ferry: drain timeout, abandoning in-flight messages", "group", m.scope,
			"queue", r.id.String(), "in_flight", st.InFlight, "timeout", m.cfg.drainTimeout)
	}
	if err != nil {
		r.hcancel()
	}
	if err := r.commit(true); err != nil {
		m.report(err)
		if m.closing() {
			m.closeFailed(err)
		}
	}
	r.owned.Store(false)
}

// commit stores the buffer's committable offset if it moved. final marks
// the run released: no commit from it follows, so a slow committer cannot
// move the cursor back after the next owner took the queue.
func (r *queueRun) commit(final bool) error {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	return r.commitLocked(final)
}

// tryCommit is commit(false) unless another goroutine is committing r
// (false): that one, or the committer, commits what is finished.
func (r *queueRun) tryCommit() bool {
	if !r.commitMu.TryLock() {
		return false
	}
	defer r.commitMu.Unlock()
	if err := r.commitLocked(false); err != nil {
		r.m.report(err)
	}
	return true
}

// commitLocked is commit; r.commitMu is held.
func (r *queueRun) commitLocked(final bool) error {
	if r.released || !r.owned.Load() || r.lost.Load() {
		return nil
	}
	if final {
		r.released = true
	}
	off := r.buf.Committable()
	if off == r.committed {
		return nil
	}
	m := r.m
	start := time.Now()
	err := r.commitCursor(context.Background(), off)
	took := time.Since(start)
	m.recordCommit(took)
	if m.hooks != nil {
		m.hooks.onCommitted(CommitEvent{Group: m.scope, Member: m.cfg.memberID, Queue: r.id, Offset: off, Took: took, Err: err})
	}
	if err != nil {
		return &Error{Op: fmt.Sprintf("commit %s at %d", r.id, off), Err: err}
	}
	r.committed = off
	m.lastCommit.Store(time.Now().UnixNano())
	r.releaseBlocked(off)
	return nil
}

// releaseBlocked lets a Block queue drop what every group is done with.
func (r *queueRun) releaseBlocked(off int64) {
	m := r.m
	if r.t.meta.Retention.Overflow != Block {
		return
	}
	rel, ok := r.queue.(Releaser)
	if !ok {
		return
	}
	low, err := m.b.groups.releaseTo(context.Background(), r.t, m.scope, r.q, off)
	if err != nil {
		m.report(&Error{Op: fmt.Sprintf("release %s", r.id), Err: err})
		return
	}
	rel.Release(low)
}
