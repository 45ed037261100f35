package ferry

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Delivery is what the consumer tells a handler about the delivery it is
// handling, through the handler's context (see [DeliveryFrom]).
type Delivery struct {
	// Group is the consumer group.
	Group string
	// Member is the consumer's member ID in the group.
	Member string
	// Attempt counts the attempts of this message, from 1.
	Attempt int
	// MaxAttempts is the attempt after which a failure sends the message
	// to the dead-letter topic.
	MaxAttempts int
}

type deliveryKey struct{}

// DeliveryFrom returns the [Delivery] in a handler's context, and false
// outside a handler (a nil ctx included).
func DeliveryFrom(ctx context.Context) (Delivery, bool) {
	if ctx == nil {
		return Delivery{}, false
	}
	d, ok := ctx.Value(deliveryKey{}).(*Delivery)
	if !ok || d == nil {
		return Delivery{}, false
	}
	return *d, true
}

// deliveryCtx is what a worker's handler calls share: the context they
// run under (the queue's handler context, set for each batch), the
// Delivery they start from, and counts. Each call gets a handlerCtx of its
// own from it (see handlerCtx).
type deliveryCtx struct {
	context.Context
	d Delivery
	// hc is the last handlerCtx made: the next call takes it again when
	// nothing in it would differ.
	hc *handlerCtx
	// handled and failed count the worker's handler calls since its
	// last flush into the deliverer's counters (once a batch).
	handled, failed uint64
	// stage holds a Transactional batch's calls for one commit at its
	// end (see txnStage); nil outside such a batch.
	stage *txnStage
}

// flush adds the worker's counts to d's.
func (c *deliveryCtx) flush(d *deliverer) {
	if c.handled > 0 {
		d.handled.Add(c.handled)
		c.handled = 0
	}
	if c.failed > 0 {
		d.failed.Add(c.failed)
		c.failed = 0
	}
}

// Headers the consumer sets on a message it sends to the dead-letter
// topic (beside the message's own headers).
const (
	HeaderOriginTopic  = "ferry-origin-topic"
	HeaderOriginQueue  = "ferry-origin-queue"
	HeaderOriginOffset = "ferry-origin-offset"
	HeaderOriginID     = "ferry-origin-id"
	HeaderGroup        = "ferry-group"
	HeaderAttempts     = "ferry-attempts"
	HeaderError        = "ferry-error"
)

// deliverer runs a push consumer's handler: its workers take batches from
// the buffers, its retry loop brings failed messages back after their
// backoff, and it sends what fails for good to the dead-letter topic.
type deliverer struct {
	m *groupMember
	c *Consumer // retries off the queue go through it; nil: in place (or to its own topic)
	h Handler
	// cost is the handler's time per message (ns), a moving average over
	// the batches the workers time: it sizes batches and decides when a
	// worker calls another to share a queue's pending messages. Until
	// measured, a worker takes one message, times it and keeps the rest
	// for itself, its guard calling another worker if the handler runs
	// long (a worker started for every consumer's first messages would
	// cost 10,000 goroutines when 10,000 idle topics get a few messages
	// each).
	cost     atomic.Int64
	measured atomic.Bool

	// Counters for Stats.
	handled, failed, retried, deadLettered atomic.Uint64

	// txs is the group's cursor store when it runs handlers in its
	// transactions (see TxCursorStore); nil otherwise.
	txs TxCursorStore
	// lim is the rate limit of the handler calls (see WithRateLimit);
	// nil without one.
	lim *limiter
	// bh is the batch handler when h is one (see Batch); nil otherwise.
	bh *batchHandler

	calls atomic.Pointer[callSlab] // the outbox calls of a Transactional consumer (see outboxCall)

	retryWake chan struct{}
	mu        sync.Mutex // guards delayed, looping, producer and outbox
	delayed   retryHeap
	looping   bool // the retry loop runs
	producer  *Producer
	outbox    *Producer // routes outboxes' Sends by default (see Transactional)
}

func newDeliverer(m *groupMember, h Handler) *deliverer {
	d := &deliverer{m: m, h: h, retryWake: make(chan struct{}, 1)}
	d.txs, _ = m.b.cursors.(TxCursorStore)
	if m.cfg.limited {
		d.lim = newLimiter(m.cfg.rate, m.cfg.burst)
	}
	d.bh, _ = h.(*batchHandler)
	d.cost.Store(int64(shareBudget)) // slow until measured (see runBatch)
	return d
}

// yieldEvery is how long a worker handles batches before it yields the
// processor anyway, so that a goroutine that has just become runnable
// (a membership change not yet seen) waits behind each busy worker for
// this long at most, not a whole scheduler time slice.
const yieldEvery = time.Millisecond

// shareBudget is the handling time a worker takes on alone: it takes as
// many messages as the handler gets through in that time (at most
// maxAlone), and calls another worker only when the pending messages left
// would take longer. Waking a worker costs microseconds; sharing work
// that takes less than that only adds wake-ups.
const shareBudget = 50 * time.Microsecond

// maxAlone bounds the messages a worker takes for itself beyond its fair
// share: if the handler stalls on one, the others wait with it.
const maxAlone = 16

// shareGuard bounds how long pending messages a worker kept for itself
// wait when its batch runs long (the handler slowed down): another worker
// is called then.
const shareGuard = 2 * shareBudget

// timeBatch reports whether a worker times a batch of n messages: those
// of several messages (the clock reads are shared), and one in 16 others.
func timeBatch(n int, seq uint) bool { return n >= 4 || seq%16 == 0 }

// record folds a timed batch of n messages into d's cost estimate.
func (d *deliverer) record(elapsed time.Duration, n int) {
	per := int64(elapsed) / int64(n)
	if !d.measured.Load() {
		d.cost.Store(per) // the first measure replaces the guess
		d.measured.Store(true)
		return
	}
	old := d.cost.Load()
	d.cost.Store(old + (per-old)/2)
}

// worker is what a goroutine handling batches keeps between them: a
// worker's, or a fetch loop's handling what it fetched (see
// scheduler.handOff). Workers are pooled across consumers.
type worker struct {
	dctx     *deliveryCtx
	batch    []*EnhancedMessage
	finished []*EnhancedMessage
	todo     []keyedMsg  // OrderedByKey: the messages a turn starts (see runKeyed)
	freed    []*keySlot  // OrderedByKey: keys whose message finished, to release
	guard    *time.Timer // calls another worker when a batch runs long
	stage    txnStage    // a Transactional batch's calls in memory (see runBatch)
	sched    atomic.Pointer[scheduler]
	yielded  time.Time // when it last yielded the processor
	seq      uint
}

var workerPool sync.Pool

// getWorker returns a worker for d's consumer.
func (d *deliverer) getWorker() *worker {
	w, _ := workerPool.Get().(*worker)
	if w == nil {
		w = &worker{
			dctx:     &deliveryCtx{},
			batch:    make([]*EnhancedMessage, 64),
			finished: make([]*EnhancedMessage, 0, 64),
		}
		w.guard = time.AfterFunc(time.Hour, func() {
			if s := w.sched.Load(); s != nil {
				s.signal()
			}
		})
		w.guard.Stop()
	}
	m := d.m
	w.dctx.d = Delivery{Group: m.group, Member: m.cfg.memberID, MaxAttempts: m.cfg.maxAttempts}
	w.dctx.hc = nil
	w.sched.Store(&m.sched)
	return w
}

// putWorker gives w back to the pool.
func putWorker(w *worker) {
	w.guard.Stop()
	w.sched.Store(nil)
	w.dctx.Context, w.dctx.hc = nil, nil
	workerPool.Put(w)
}

// work is one worker goroutine: it takes batches from buffers with
// pending messages (or due retries) until it has been idle for
// workerIdle or the consumer halts.
func (d *deliverer) work() {
	m := d.m
	defer m.wg.Done()
	w := d.getWorker()
	defer putWorker(w)
	idle := time.NewTimer(workerIdle) // reused by every wait for work
	idle.Stop()
	for {
		r, it := m.sched.next(context.Background(), m.halt, idle)
		if r == nil && it == nil {
			return
		}
		d.serve(w, r, it)
	}
}

// workInline is a worker in the caller's goroutine (a fetch loop's, see
// scheduler.handOff), counted in already: it returns, counted out, once
// nothing is listed.
func (d *deliverer) workInline() {
	m := d.m
	defer m.wg.Done()
	w := d.getWorker()
	defer putWorker(w)
	for {
		r, it := m.sched.take(true)
		if r == nil && it == nil {
			return
		}
		d.serve(w, r, it)
	}
}

// serve handles what a worker took: a run with pending messages or a
// due retry. Two buffer locks per batch, one to take and one to mark
// done.
func (d *deliverer) serve(w *worker, r *queueRun, it *retryItem) {
	m := d.m
	dctx := w.dctx
	switch {
	case it != nil:
		if !it.r.admit() {
			d.abandonKey(it.r, it.msg) // the next owner gets it again, with its key's waiting ones
			return
		}
		dctx.Context = it.r.hctx
		var done bool
		switch {
		case it.resend:
			done = d.retryOff(it.r, it.msg, it.attempt, it.cause, it.tries, it.id)
		case it.cause != nil:
			done = d.deadLetterOrRetry(it.r, it.msg, it.attempt, it.cause, it.tries)
		default:
			done = d.handle(dctx, it.r, it.msg, it.attempt)
		}
		dctx.flush(d)
		if done {
			it.r.buf.Done(it.msg)
			m.finished(it.r)
			if m.cfg.orderedByKey {
				d.handleChain(dctx, it.r, d.nextOfKey(it.r, it.msg.Key), nil)
				dctx.flush(d)
			}
		}
	case m.cfg.ordered:
		d.ordered(dctx, r, w.batch[:1])
	case m.cfg.orderedByKey:
		d.runKeyed(w, r)
	default:
		d.runBatch(w, r)
	}
}

// runBatch takes a share of r's pending messages and handles them; it
// lists r again (waking another worker when it is worth it) when messages
// remain.
func (d *deliverer) runBatch(w *worker, r *queueRun) {
	m := d.m
	dctx := w.dctx
	cost := max(1, d.cost.Load())
	measured := d.measured.Load()
	least := int(min(maxAlone, int64(shareBudget)/cost))
	dst := w.batch
	if d.lingers(r) {
		return // the timer lists r again
	}
	if d.bh != nil {
		if len(w.batch) < d.bh.max {
			w.batch = make([]*EnhancedMessage, d.bh.max)
		}
		dst, least = w.batch[:d.bh.max], d.bh.max
	}
	n, pending := r.buf.takeShare(dst, m.cfg.concurrency, least)
	guarded := false
	switch {
	case pending == 0:
	case measured && int64(pending)*cost > int64(shareBudget):
		m.sched.push(r) // worth another worker
	default:
		m.sched.pushQuiet(r) // this worker comes back for them
		w.guard.Reset(shareGuard)
		guarded = true
	}
	dctx.Context = r.hctx
	finished := w.finished[:0]
	w.seq++
	timed := n > 0 && (!measured || timeBatch(n, w.seq))
	var start time.Time
	if timed {
		start = time.Now()
	}
	batch := w.batch
	if d.bh != nil && n > 0 {
		finished = d.handleBatch(dctx, r, batch[:n], finished)
	}
	if r.tl != nil && d.bh == nil {
		dctx.stage = &w.stage // the calls commit together (see txnStage)
		w.stage.start(d)
	}
	for i, msg := range batch[:n] {
		if d.bh != nil {
			break // handled as one
		}
		if !r.admit() {
			// Revoked, closing or lost, or the lease may have expired
			// (the process was paused past its TTL): what has not
			// started goes back unfinished, to the next owner.
			r.buf.abandon(batch[i:n]...)
			break
		}
		if d.handle(dctx, r, msg, d.firstAttempt(msg)) {
			finished = append(finished, msg)
		}
	}
	if st := dctx.stage; st != nil {
		st.flush(d, dctx)
		dctx.stage = nil
		finished = st.finishing(finished)
	}
	var end time.Time
	if timed {
		end = time.Now()
		d.record(end.Sub(start), n)
	}
	dctx.flush(d)
	if guarded {
		w.guard.Stop()
	}
	if len(finished) > 0 {
		r.buf.Done(finished...)
		m.finished(r)
	}
	clear(batch[:n])
	clear(finished)
	w.finished = finished
	if m.b.urgent.Load() > 0 || timed && end.Sub(w.yielded) > yieldEvery {
		// Let a rebalance, or whatever else waits, run (see urgent).
		runtime.Gosched()
		w.yielded = end
	}
}

// ordered handles r's messages one at a time, in order, holding the
// buffer's consumption lock, until none is pending, the queue is being
// released, or a fair share is done.
func (d *deliverer) ordered(dctx *deliveryCtx, r *queueRun, one []*EnhancedMessage) {
	if !r.buf.TryLock() {
		return // another worker has the queue; it reschedules it after
	}
	dctx.Context = r.hctx
	if d.bh != nil {
		d.orderedBatches(dctx, r)
		return
	}
	for range 64 {
		if !r.admitTake() {
			break
		}
		n, _ := r.buf.Take(one)
		if n == 0 {
			break
		}
		msg := one[0]
		one[0] = nil
		if d.handleOrdered(dctx, r, msg) {
			r.buf.Done(msg)
			d.m.finished(r)
		} else {
			r.buf.abandon(msg)
			break
		}
	}
	r.buf.Unlock()
	dctx.flush(d)
	if r.buf.Pending() > 0 {
		d.m.sched.push(r)
	}
}

// handleOrdered attempts msg until it succeeds or goes to the dead-letter
// topic (true), waiting out the backoff in place so its queue waits; a
// failed dead-letter send is tried again, with backoff, in place too. It
// returns false when the queue is revoked or the handlers' context ends
// first: a failed message is then left to the next owner rather than
// retried (or dead-lettered) by a member giving the queue up, so a
// release never waits out a backoff.
func (d *deliverer) handleOrdered(dctx *deliveryCtx, r *queueRun, msg *EnhancedMessage) bool {
	return d.orderedFrom(dctx, r, msg, 1, nil)
}

// orderedFrom is handleOrdered from attempt on; with a non-nil failed,
// that attempt was made already (in a batch) and failed so.
func (d *deliverer) orderedFrom(dctx *deliveryCtx, r *queueRun, msg *EnhancedMessage, attempt int, failed error) bool {
	m := d.m
	for ; ; attempt++ {
		err := failed
		failed = nil
		if err == nil {
			if !r.admit() {
				return false
			}
			if err = d.call(dctx, r, msg, attempt); err == nil {
				return true
			}
		}
		if err == errGivenUp || !r.h.serving() {
			return false
		}
		if attempt >= m.cfg.maxAttempts || isPermanent(err) {
			for try := 1; ; try++ {
				if d.deadLetter(r, msg, attempt, err) {
					return true
				}
				if !d.wait(r, backoff(m.cfg.backoff, m.cfg.maxBackoff, try)) {
					return false
				}
			}
		}
		d.retried.Add(1)
		if !d.wait(r, d.retryWait(err, attempt)) {
			return false
		}
	}
}

// wait waits for d, or until r is revoked or its handlers' context ends
// (false).
func (d *deliverer) wait(r *queueRun, w time.Duration) bool {
	t := time.NewTimer(w)
	defer t.Stop()
	select {
	case <-t.C:
		return r.h.serving()
	case <-r.ctx.Done():
		return false
	case <-r.hctx.Done():
		return false
	}
}

// handle makes one attempt of msg in concurrent mode. It reports whether
// msg is finished; a failure with attempts left is scheduled for retry
// and stays in flight.
func (d *deliverer) handle(dctx *deliveryCtx, r *queueRun, msg *EnhancedMessage, attempt int) bool {
	err := d.call(dctx, r, msg, attempt)
	if err == nil {
		return true
	}
	return d.failure(r, msg, attempt, err)
}

// failure goes on after an attempt of msg in concurrent mode failed with
// err: dead letter, retry or give back, as handle says.
func (d *deliverer) failure(r *queueRun, msg *EnhancedMessage, attempt int, err error) bool {
	m := d.m
	if err == errGivenUp {
		d.abandonKey(r, msg)
		return false
	}
	if attempt >= m.cfg.maxAttempts || isPermanent(err) {
		return d.deadLetterOrRetry(r, msg, attempt, err, 1)
	}
	if r.hctx.Err() != nil {
		// The drain timeout gave up on the handler: the failure is the
		// giving up's, not the message's, and the queue's cursor stays
		// at it: the next owner attempts it again, uncounted.
		r.buf.abandon(msg)
		return false
	}
	if m.offQueue() {
		return d.retryOff(r, msg, attempt, err, 1, MessageID{}) // counts it once written
	}
	d.retried.Add(1)
	d.schedule(&retryItem{r: r, msg: msg, attempt: attempt + 1, due: time.Now().Add(d.retryWait(err, attempt))})
	return false
}

// call runs the handler once on r's msg, turning a panic into an error,
// through the hooks when there are, in a transaction of the cursor store
// when it is a [TxCursorStore].
func (d *deliverer) call(dctx *deliveryCtx, r *queueRun, msg *EnhancedMessage, attempt int) error {
	if !d.throttle(r) {
		return errGivenUp
	}
	hc := dctx.hc
	if hc == nil || hc.Context != dctx.Context || hc.d.Attempt != attempt {
		hc = &handlerCtx{Context: dctx.Context, d: dctx.d}
		hc.d.Attempt = attempt
		dctx.hc = hc
	}
	view := d.view(msg)
	if d.txs != nil {
		return d.callTx(dctx, hc, r, msg, view)
	}
	if r.tl != nil {
		return d.callOutbox(dctx, hc, r, msg, view)
	}
	if hs := d.m.hooks; hs != nil && (len(hs.handle) > 0 || len(hs.handled) > 0) {
		return d.callHooked(hs, dctx, hc, view)
	}
	return d.safeHandle(dctx, hc, view)
}

// callHooked is call with hooks: OnHandle may give the handler another
// context than ctx, OnHandled gets the call's duration and error.
func (d *deliverer) callHooked(hs *hookSet, dctx *deliveryCtx, ctx context.Context, msg *EnhancedMessage) error {
	for _, h := range hs.handle {
		if c := h.OnHandle(ctx, msg); c != nil {
			ctx = c
		}
	}
	start := time.Now()
	err := d.safeHandle(dctx, ctx, msg)
	took := time.Since(start)
	for _, h := range hs.handled {
		h.OnHandled(ctx, msg, took, err)
	}
	return err
}

// safeHandle calls the handler with ctx, under the consumer's time limit
// when it has one (see WithHandlerTimeout), turning a panic into an
// error, and counts the call in dctx.
func (d *deliverer) safeHandle(dctx *deliveryCtx, ctx context.Context, msg *EnhancedMessage) (err error) {
	if limit := d.m.cfg.handlerTimeout; limit > 0 {
		tc := newTimedCtx(ctx, limit)
		ctx = tc
		defer func() {
			if tc.end() && err == nil {
				err = &Error{Op: fmt.Sprintf("handle %s offset %d", msg.QueueID(), msg.Offset), Err: ErrHandlerTimeout}
				dctx.handled--
				dctx.failed++
			}
		}()
	}
	defer func() {
		if p := recover(); p != nil {
			err = &Error{Op: "handler panic", Err: fmt.Errorf("%v", p)}
			d.m.b.log.Error("ferry: handler panic", "group", d.m.group, "queue", msg.QueueID().String(),
				"offset", msg.Offset, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
		if err == nil {
			dctx.handled++
		} else {
			dctx.failed++
		}
	}()
	return d.h.Handle(ctx, msg)
}
