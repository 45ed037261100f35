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
	// dtimer fires at the deadline (see watchDeadline); dmu guards its
	// arming against the run's end (dstopped).
	dtimer   *time.Timer
	dmu      sync.Mutex
	dstopped bool
	buf      *Buffer

	// h is the holding's phase, the events posted to it and its holds
	// (see holding.go). announced is the holding goroutine's: the
	// assigned callbacks ran.
	h         holding
	announced bool

	ctx    context.Context // fetch context; cancelled when a stop is posted
	cancel context.CancelFunc
	// hctx is the context handlers run under; cancelled when the drain
	// timeout gives up on them, or the lease is lost.
	hctx    context.Context
	hcancel context.CancelFunc
	wake    chan struct{} // capacity 1: a post wakes the holding's goroutine in a drain
	ready   chan struct{} // closed once the queue is taken (or the take gave up)
	done    chan struct{} // closed when the run has released the queue

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

	// skip is the finished set the queue's cursor was loaded with (see
	// HandoffCursorStore): messages the previous owner finished, which the
	// fetch loop drops; skipAt is the first not passed yet. The fetch
	// loop's.
	skip   []int64
	skipAt int

	keys *keyed // OrderedByKey's keys in flight (see keyed.go); nil otherwise
	// lingerUntil is when a batch handler's short batch stops waiting
	// for more messages (Unix ns; 0: not waiting, see deliverer.linger).
	lingerUntil atomic.Int64

	tl *txnLog // the queue's transaction log (see Transactional); nil otherwise

	cslot     *cursorSlot // the queue's cursor, when the store is a MemoryCursorStore
	commitMu  sync.Mutex  // guards committed; commits hold it
	committed int64
}

func (m *groupMember) newRun(q int, sess Session) *queueRun {
	r := &queueRun{
		m: m, q: q, id: QueueID{Topic: m.topic, Queue: q}, t: m.view.Load().t, sess: sess,
		buf:   newBuffer(m.cfg.buffer),
		seeks: make(chan seekReq, 1),
		wake:  make(chan struct{}, 1),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	r.queue = r.t.queues[q]
	if m.cfg.orderedByKey {
		r.keys = newKeyed()
	}
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
		r.step(evFailed)
		r.stepPosted()
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
	r.step(evGranted)
	r.stopWatch = r.watchLost()
	r.watchDeadline()
	start, err := r.load()
	if err != nil {
		if r.ctx.Err() == nil {
			m.report(err)
		}
		r.step(evFailed)
		r.stepPosted()
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
	if r.step(evLoaded)&doAnnounce != 0 {
		r.announced = true
		r.callback("assigned", m.cfg.onAssigned)
		m.hooks.onRebalanced(m.scope, m.cfg.memberID, r.id, true)
	}
	r.markReady()
	r.act(r.stepPosted()) // a revoke or a loss posted meanwhile
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
		if len(r.seeks) == 0 && r.ctx.Err() == nil && !r.h.held(holdPause) && p.park(r.buf.Next(), &r.waiter) && r.kicks.CompareAndSwap(n, 0) {
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
	r.act(r.stepPosted())
	r.release()
	if r.announced {
		r.callback("revoked", m.cfg.onRevoked)
		m.hooks.onRebalanced(m.scope, m.cfg.memberID, r.id, false)
	}
	r.end(true)
}

// end ends the run: it unlocks the queue (if locked) and tells the member.
func (r *queueRun) end(locked bool) {
	if locked {
		r.stopWatch()
		r.stopDeadline()
		r.unlock()
	}
	r.markReady()
	r.hcancel()
	if r.tl != nil {
		r.tl.stop()
	}
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

// watchDeadline arms a timer at the lease's deadline, when it has one
// (see DeadlineLease): once the lease may have expired by this process's
// clock, the run loses the queue then, cancelling its handlers' context,
// though no gate was passed meanwhile to notice it.
func (r *queueRun) watchDeadline() {
	if r.deadline == nil {
		return
	}
	r.dtimer = time.AfterFunc(time.Hour, r.checkDeadline)
	r.armDeadline()
}

// checkDeadline is the deadline timer's: it loses the queue if the
// deadline passed, and waits for the next one if a renewal moved it.
func (r *queueRun) checkDeadline() {
	if r.h.posted(evLost) || r.expired() {
		return
	}
	r.armDeadline()
}

// noDeadlineRecheck is how often a lease with no deadline yet is looked
// at again.
const noDeadlineRecheck = time.Second

// armDeadline sets the deadline timer for the lease's deadline now.
func (r *queueRun) armDeadline() {
	wait := noDeadlineRecheck
	if d, ok := r.deadline.Deadline(); ok {
		wait = max(time.Until(d), time.Millisecond)
	}
	r.dmu.Lock()
	defer r.dmu.Unlock()
	if !r.dstopped {
		r.dtimer.Reset(wait)
	}
}

// stopDeadline stops the deadline timer for good.
func (r *queueRun) stopDeadline() {
	if r.dtimer == nil {
		return
	}
	r.dmu.Lock()
	r.dstopped = true
	r.dtimer.Stop()
	r.dmu.Unlock()
}

// lose posts the loss of the lease (or a fenced commit, or a deadline
// passed): the run stops at once, cancels its handlers, and commits
// nothing more, since its token is stale. What was in flight goes to the
// next owner. Any goroutine, a coordinator's callback included: it only
// posts.
func (r *queueRun) lose() { r.post(evLost) }

// post posts a stop (revoke, closing, lost) from any goroutine: the gates
// see it at once (no take and no handling starts after it; a loss
// cancels the handlers' context at once too), and the holding's goroutine
// steps it: it is woken wherever it waits (a Lock, a
// cursor load, a Read, a Put, a drain), or started if parked.
func (r *queueRun) post(e event) {
	if !r.h.post(e) {
		return
	}
	if e == evLost {
		// The lease may be another member's already: the handlers learn
		// it now, not when the holding's goroutine steps the loss.
		r.hcancel()
	}
	r.cancel()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	r.kick()
}

// step steps the holding through e and returns what the transition asks
// for. The holding's goroutine only.
func (r *queueRun) step(e event) action {
	p := r.h.phase()
	next, do, ok := transition(p, e)
	if !ok {
		return 0
	}
	r.h.setPhase(next)
	if next == lost && p != lost {
		r.m.b.log.Warn("ferry: queue lease lost", "group", r.m.scope, "queue", r.id.String(), "member", r.m.cfg.memberID, "phase", p.String())
	}
	return do
}

// stepPosted steps the events posted since the holding's goroutine last
// looked, a loss first (it skips the drain), and returns what they ask
// for. The holding's goroutine only.
func (r *queueRun) stepPosted() action {
	s := r.h.st.Load() & postedStop &^ r.h.stepped
	var do action
	for _, e := range [...]event{evLost, evRevoke, evClosing} {
		if bit := postedBit(e); s&bit != 0 {
			r.h.stepped |= bit
			do |= r.step(e)
		}
	}
	return do
}

// act does what transitions asked for, but the drain and the last commit
// (see release).
func (r *queueRun) act(do action) {
	if do&doStopIntake != 0 {
		r.buf.Close() // no take after this: the drain is final
		r.cancel()
	}
	if do&doCancelHandlers != 0 {
		r.hcancel()
	}
}

// unlockTimeout bounds the Release of a lease.
const unlockTimeout = 10 * time.Second

// unlock releases the lease, reporting a failure.
func (r *queueRun) unlock() {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	if err := r.lease.Release(ctx); err != nil && !r.h.posted(evLost) {
		r.m.report(&Error{Op: fmt.Sprintf("unlock %s", r.id), Err: err})
	}
}

// setPaused pauses or resumes the run: a paused run fetches nothing more
// and hands none of its pending messages out; what is in flight goes on.
func (r *queueRun) setPaused(p bool) {
	if !r.h.hold(holdPause, p) || p {
		return
	}
	r.kick()
	if r.buf.Pending() > 0 || r.keys != nil && r.keys.hasReady() {
		r.m.sched.push(r)
	}
}

// admits reports whether a take of r's messages may start (see
// holding.takes), the lease's local deadline included. A worker's take
// from the scheduler and each take of an ordered run check it. It only
// reads: see admitTake.
func (r *queueRun) admits() bool { return r.h.takes() && !r.pastDeadline() }

// admitTake is admits, losing the queue if its lease's deadline passed.
func (r *queueRun) admitTake() bool { return r.h.takes() && !r.expired() }

// admit is the gate every handling, retry attempt and dead-letter or
// retry write passes before it starts: the queue is served (not revoked,
// closing or lost) and its lease may not have expired by this process's
// clock. A taken message that may not start goes back unfinished.
func (r *queueRun) admit() bool { return r.h.serving() && !r.expired() }

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
// queue at once (see lose), without waiting for Lost. Not under the
// scheduler's lock (lose kicks the fetch loop).
func (r *queueRun) expired() bool {
	if !r.pastDeadline() {
		return false
	}
	r.lose()
	return true
}

// revoke posts the queue's revoke (by a rebalance) or, when the member
// closes, its closing: intake stops at once, before the run drains (no
// message is taken from the buffer and no handling or retry of one starts
// after it; the unstarted rest of a taken batch goes back unfinished), so
// nothing can overtake a message left unfinished; then the fetch loop
// stops and the run releases the queue.
func (r *queueRun) revoke() {
	if r.m.closing() {
		r.post(evClosing)
		return
	}
	r.post(evRevoke)
}

// release drains what is in flight (up to the drain timeout) and commits
// for the last time, unless the lease was lost. It runs in the fetch
// loop, once the holding is releasing or lost; the caller unlocks.
func (r *queueRun) release() {
	m := r.m
	if m.dropRetries != nil {
		m.dropRetries(r) // a retry's backoff must not hold the release
	}
	if r.h.phase() != releasing {
		return // lost: nothing can finish
	}
	timeout := m.cfg.drainTimeout
	if m.pull && (r.h.posted(evClosing) || m.closing()) {
		timeout = 0 // nothing in flight can finish: Commit is refused after Close
	}
	ev := r.drain(timeout)
	var do action
	if ev == evLost {
		do = r.stepPosted()
	} else {
		do = r.step(ev)
	}
	if ev == evDrainTimeout && timeout > 0 {
		st := r.buf.Stats()
		m.b.log.Warn("ferry: drain timeout, abandoning in-flight messages", "group", m.scope,
			"queue", r.id.String(), "in_flight", st.InFlight, "timeout", m.cfg.drainTimeout)
	}
	r.act(do)
	if do&doCommit == 0 {
		return
	}
	if r.tl != nil && timeout > 0 {
		// The outputs of finished inputs, written: the last commit
		// commits the log's floor past their records.
		ctx, cancel := context.WithTimeout(r.hctx, timeout)
		r.tl.quiesce(ctx)
		cancel()
	}
	if err := r.commit(true); err != nil {
		m.report(err)
		if m.closing() {
			m.closeFailed(err)
		}
	}
}

// drain waits up to timeout until nothing taken is unfinished, and
// returns the event that ended the wait: drained, drainTimeout, or lost
// (posted meanwhile).
func (r *queueRun) drain(timeout time.Duration) event {
	var expiry <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expiry = t.C
	}
	for {
		if r.h.posted(evLost) {
			return evLost
		}
		ch := r.buf.drainedChan()
		if ch == nil {
			return evDrained
		}
		if expiry == nil {
			return evDrainTimeout
		}
		select {
		case <-ch:
		case <-r.wake:
		case <-expiry:
			if r.buf.drainedChan() == nil {
				return evDrained
			}
			return evDrainTimeout
		}
	}
}
