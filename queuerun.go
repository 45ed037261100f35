package ferry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

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
