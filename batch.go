package ferry

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"strings"
	"time"
)

// BatchHandler handles several messages of one queue at once, in offset
// order (see [Batch]).
type BatchHandler interface {
	HandleBatch(ctx context.Context, msgs []*EnhancedMessage) error
}

// BatchHandlerFunc adapts a function to a [BatchHandler].
type BatchHandlerFunc func(ctx context.Context, msgs []*EnhancedMessage) error

// HandleBatch calls f(ctx, msgs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, msgs []*EnhancedMessage) error {
	return f(ctx, msgs)
}

// BatchError is what a [BatchHandler] returns when some messages of a
// batch failed and the others succeeded: Failed[i] is the error of
// msgs[i] (Permanent, RetryAfter and the rest work as for one message).
// Any other non-nil error fails every message of the batch.
type BatchError struct {
	Failed map[int]error
}

func (e *BatchError) Error() string {
	idx := make([]int, 0, len(e.Failed))
	for i := range e.Failed {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	fmt.Fprintf(&b, "%d of the batch failed", len(idx))
	for k, i := range idx {
		if k == 3 {
			fmt.Fprintf(&b, "; …")
			break
		}
		fmt.Fprintf(&b, "; [%d]: %v", i, e.Failed[i])
	}
	return b.String()
}

// errOf returns the error of msgs[i] in a batch that returned err.
func batchErrOf(err error, i int) error {
	if err == nil {
		return nil // before errors.As: its target would be allocated for every message
	}
	var be *BatchError
	if errors.As(err, &be) {
		return be.Failed[i]
	}
	return err
}

// Batch makes a [Handler] of h for [Broker.NewConsumer]: the consumer
// hands h up to max messages of one queue at a time, in offset order —
// those pending when a worker takes its share (see [BatchLinger] to wait
// for more to arrive). Each message's result is its own: nil succeeds them all, a
// [BatchError] fails the ones it names, another error fails them all; a
// failed message is retried or dead-lettered as it would be alone (its
// retries come as batches of one, or with other retries, in the retry
// topic's order; the call's [Delivery].Attempt is its first message's). A panic fails
// the batch. Cursors are as for single messages (the smallest unfinished
// offset). In concurrent mode batches of one queue run in parallel up to
// [WithConcurrency]; with [Ordered] a batch is a prefix of the queue, and
// when one of its messages fails, those after it are handed over again
// after it succeeds or goes to the dead-letter topic (the handler saw
// them once already: at least once). With [OrderedByKey] batches hold one
// message. [WithHandlerTimeout] and [WithRateLimit] count a batch call as
// a call, and a call of n messages takes n tokens. A cursor store that
// runs handlers in its transactions ([TxCursorStore]) is not used with
// batches: [Broker.NewConsumer] refuses the combination. A max below 1
// is [ErrInvalidOption] there.
func Batch(h BatchHandler, max int) Handler {
	return BatchLinger(h, max, 0)
}

// BatchLinger is [Batch] that waits for a batch to fill: when fewer than
// max messages of a queue are pending, they wait up to linger (from when
// a worker first found them so) for more, then go as they are. A linger
// of zero is Batch; a negative one is [ErrInvalidOption] in
// [Broker.NewConsumer].
func BatchLinger(h BatchHandler, max int, linger time.Duration) Handler {
	if h == nil {
		return nil
	}
	return &batchHandler{h: h, max: max, linger: linger}
}

// batchHandler is Batch's Handler: Handle hands over a batch of one.
type batchHandler struct {
	h      BatchHandler
	max    int
	linger time.Duration
}

// lingers reports whether a worker leaves r's pending messages to wait
// for more (see BatchLinger): fewer than a batch, and their linger not
// over; it arms a timer that lists r again when it is.
func (d *deliverer) lingers(r *queueRun) bool {
	bh := d.bh
	if bh == nil || bh.linger <= 0 || r.buf.Pending() >= bh.max {
		r.lingerUntil.Store(0)
		return false
	}
	now := time.Now().UnixNano()
	until := r.lingerUntil.Load()
	if until == 0 {
		until = now + int64(bh.linger)
		if r.lingerUntil.CompareAndSwap(0, until) {
			time.AfterFunc(bh.linger, func() { d.m.sched.push(r) })
		} else {
			until = r.lingerUntil.Load()
		}
	}
	if now < until {
		return true
	}
	r.lingerUntil.Store(0)
	return false
}

func (b *batchHandler) Handle(ctx context.Context, m *EnhancedMessage) error {
	return batchErrOf(b.h.HandleBatch(ctx, []*EnhancedMessage{m}), 0)
}

// handleBatch makes one call of the batch handler on msgs, taken from r
// in concurrent mode, and goes on with each message's result as handle
// does with one; it appends the finished ones to finished.
func (d *deliverer) handleBatch(dctx *deliveryCtx, r *queueRun, msgs []*EnhancedMessage, finished []*EnhancedMessage) []*EnhancedMessage {
	if !r.admit() {
		r.buf.abandon(msgs...)
		return finished
	}
	for range msgs {
		if !d.throttle(r) {
			r.buf.abandon(msgs...)
			return finished
		}
	}
	err := d.callBatch(dctx, msgs)
	for i, msg := range msgs {
		e := batchErrOf(err, i)
		if e == nil {
			dctx.handled++
			finished = append(finished, msg)
			continue
		}
		dctx.failed++
		if d.failure(r, msg, d.firstAttempt(msg), e) {
			finished = append(finished, msg)
		}
	}
	return finished
}

// callBatch calls the batch handler once on msgs (their views, see
// deliverer.view), through the hooks and under the time limit when there
// are, turning a panic into an error.
func (d *deliverer) callBatch(dctx *deliveryCtx, msgs []*EnhancedMessage) (err error) {
	attempt := d.firstAttempt(msgs[0])
	hc := &handlerCtx{Context: dctx.Context, d: dctx.d}
	hc.d.Attempt = attempt
	views := make([]*EnhancedMessage, len(msgs))
	for i, msg := range msgs {
		views[i] = d.view(msg)
	}
	// Each message goes through the hooks from the call's context (a
	// span each, say); the handler gets the first message's.
	ctx := context.Context(hc)
	hs := d.m.hooks
	var ctxs []context.Context
	if hs != nil && (len(hs.handle) > 0 || len(hs.handled) > 0) {
		ctxs = make([]context.Context, len(views))
		for i, v := range views {
			c := context.Context(hc)
			for _, h := range hs.handle {
				if hc2 := h.OnHandle(c, v); hc2 != nil {
					c = hc2
				}
			}
			ctxs[i] = c
		}
		ctx = ctxs[0]
	}
	if limit := d.m.cfg.handlerTimeout; limit > 0 {
		tc := newTimedCtx(ctx, limit)
		ctx = tc
		defer func() {
			if tc.end() && err == nil {
				err = &Error{Op: fmt.Sprintf("handle a batch of %s at offset %d", msgs[0].QueueID(), msgs[0].Offset), Err: ErrHandlerTimeout}
			}
		}()
	}
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			err = &Error{Op: "handler panic", Err: fmt.Errorf("%v", p)}
			d.m.b.log.Error("ferry: handler panic", "group", d.m.group, "queue", msgs[0].QueueID().String(),
				"offset", msgs[0].Offset, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
		if ctxs != nil {
			took := time.Since(start)
			for i, v := range views {
				for _, h := range hs.handled {
					h.OnHandled(ctxs[i], v, took, batchErrOf(err, i))
				}
			}
		}
	}()
	return d.bh.h.HandleBatch(ctx, views)
}

// orderedBatches is ordered with a batch handler: it takes prefixes of
// r's pending messages, up to the handler's max, and hands each over in
// one call; a failed message is retried in place (alone) until it
// succeeds or goes to the dead-letter topic, and the messages after it
// are handed over again then. r.buf's lock is held (see ordered).
func (d *deliverer) orderedBatches(dctx *deliveryCtx, r *queueRun) {
	w := make([]*EnhancedMessage, d.bh.max)
	lingering := false
	for range 8 {
		if !r.admitTake() {
			break
		}
		if lingering = d.lingers(r); lingering {
			break // the linger's timer lists r again
		}
		n, _ := r.buf.Take(w)
		if n == 0 {
			break
		}
		if !d.orderedBatch(dctx, r, w[:n]) {
			break
		}
		clear(w[:n])
	}
	r.buf.Unlock()
	dctx.flush(d)
	if !lingering && r.buf.Pending() > 0 {
		d.m.sched.push(r)
	}
}

// orderedBatch handles msgs, a prefix of r's queue, in order; false when
// r is being given up (what is unfinished goes back).
func (d *deliverer) orderedBatch(dctx *deliveryCtx, r *queueRun, msgs []*EnhancedMessage) bool {
	for len(msgs) > 0 {
		ok := r.admit()
		for range msgs {
			if ok && !d.throttle(r) {
				ok = false
			}
		}
		if !ok {
			r.buf.abandon(msgs...)
			return false
		}
		err := d.callBatch(dctx, msgs)
		k := len(msgs) // the first failed
		for i := range msgs {
			if batchErrOf(err, i) != nil {
				k = i
				break
			}
		}
		dctx.handled += uint64(k)
		if k > 0 {
			r.buf.Done(msgs[:k]...)
			d.m.finished(r)
		}
		if k == len(msgs) {
			return true
		}
		dctx.failed++
		if !r.h.serving() || !d.orderedFrom(dctx, r, msgs[k], d.firstAttempt(msgs[k]), batchErrOf(err, k)) {
			r.buf.abandon(msgs[k:]...)
			return false
		}
		r.buf.Done(msgs[k])
		d.m.finished(r)
		msgs = msgs[k+1:]
	}
	return true
}
