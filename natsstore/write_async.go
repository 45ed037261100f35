package natsstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/ferrymq/ferry"
)

var _ ferry.AsyncWriter = (*queue)(nil)

// inflight is one WriteAsync: its publish's ack to come (or its error
// already), reported in order by the queue's acker.
type inflight struct {
	ctx      context.Context
	msgs     []*ferry.EnhancedMessage
	ack      jetstream.PubAckFuture // nil when err is set or deferred
	deferred bool                   // not published: the acker writes it with Write's logic
	hint     int64                  // the stream's end known when it was published
	err      error
	done     func(int64, error)
}

// WriteAsync implements [ferry.AsyncWriter]: it publishes msgs as Write
// does (one message with its Nats-Msg-Id, several as one atomic batch),
// but without waiting for the ack, so that one goroutine's writes are
// pipelined on the connection; the stream stores them in the order they
// were published. A goroutine of the queue's (the acker, running while
// writes are in flight) waits for the acks in that order and calls done.
// Each ack is waited for up to the op timeout. A write the stream did
// not store for a passing reason (an atomic batch its leader dropped
// when it stepped down, "incomplete", 10176; no responders), or whose
// ack did not come in time, stops the pipeline: the writes behind it are
// waited for, one whose ack did not come is looked for in the stream,
// and the write is written again in its place if no write behind it may
// have been stored; otherwise it fails (not stored, or its outcome
// unknown), since storing it then would put it after them. So the
// stored writes are always in the order begun. A write whose ctx ends
// fails with its outcome unknown; writes after it go on. A full stream ([ferry.Block]) is
// [ferry.ErrQueueFull], never a wait (the producer writes Block topics
// with Write). Close waits for the writes in flight, each up to the op
// timeout ([WithOpTimeout]; then ErrClosed, the outcome unknown).
//
// A single message with a dedup key that the stream stored within the
// window is reported as Write reports it. A batch of several messages
// one of which carries a key is not pipelined: the stream refuses such
// a batch whole when one key is a duplicate, and publishing the rest
// again after writes published behind it would store it after them. So
// it waits in line, and the acker writes it, as Write does, once every
// write before it is reported; the writes begun after it wait behind it
// too.
func (q *queue) WriteAsync(ctx context.Context, msgs []*ferry.EnhancedMessage, done func(first int64, err error)) {
	w := &inflight{ctx: ctx, msgs: msgs, done: done}
	if w.err = q.checkAsync(ctx, msgs); w.err == nil {
		q.amu.Lock()
		w.deferred = q.deferred > 0 || q.recovering || q.keyedBatch(msgs)
		q.amu.Unlock()
		if !w.deferred {
			q.mu.Lock()
			w.hint = q.next
			q.mu.Unlock()
			w.err = q.publishAsync(msgs, &w.ack)
		}
	}
	if w.err != nil {
		w.err = &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: w.err}
	}
	q.amu.Lock()
	if q.aclosed {
		q.amu.Unlock()
		done(0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: ferry.ErrClosed})
		return
	}
	if w.deferred {
		q.deferred++
	}
	q.inflight = append(q.inflight, w)
	if !q.acking {
		q.acking = true
		q.awg.Add(1)
		go q.acker()
	}
	q.amu.Unlock()
}

// keyedBatch reports whether msgs are several and one is stored under
// its key.
func (q *queue) keyedBatch(msgs []*ferry.EnhancedMessage) bool {
	if len(msgs) < 2 {
		return false
	}
	for _, m := range msgs {
		if q.keyed(m) {
			return true
		}
	}
	return false
}

// checkAsync checks msgs as write does.
func (q *queue) checkAsync(ctx context.Context, msgs []*ferry.EnhancedMessage) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if q.isClosed() {
		return ferry.ErrClosed
	}
	size := int64(0)
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("%w: message %d is nil", ferry.ErrInvalidMessage, i)
		}
		size += int64(m.Size())
	}
	r := q.meta.Retention
	switch {
	case len(msgs) > MaxBatch:
		return fmt.Errorf("%w: batch of %d messages, at most %d", ferry.ErrMessageTooLarge, len(msgs), MaxBatch)
	case r.MaxMessages > 0 && int64(len(msgs)) > r.MaxMessages:
		return fmt.Errorf("%w: batch of %d messages, retention %d", ferry.ErrMessageTooLarge, len(msgs), r.MaxMessages)
	case r.MaxBytes > 0 && size > r.MaxBytes:
		return fmt.Errorf("%w: batch of %d bytes, retention %d", ferry.ErrMessageTooLarge, size, r.MaxBytes)
	}
	return ctx.Err()
}

// publishAsync publishes msgs (checked), setting ack to the future of
// the (last) publish.
func (q *queue) publishAsync(msgs []*ferry.EnhancedMessage, ack *jetstream.PubAckFuture) error {
	if len(msgs) == 0 {
		return nil // reported with the next offset, as Write does
	}
	now := time.Now().UnixNano()
	n := len(msgs)
	var batchID string
	if n > 1 {
		batchID = msgs[0].ID.String()
	}
	nc := q.s.js.Conn()
	for i, m := range msgs {
		m.Queue, m.Offset, m.StoreUnixNano = q.id.Queue, 0, now
		out := q.natsMsg(m, i == 0) // a batch of several has no keys (see keyedBatch)
		h := out.Header
		if n > 1 {
			h[jetstreamext.BatchIDHeader] = []string{batchID}
			h[jetstreamext.BatchSeqHeader] = []string{strconv.Itoa(i + 1)}
		}
		if i < n-1 {
			if err := nc.PublishMsg(out); err != nil {
				return err
			}
			continue
		}
		if n > 1 {
			h[jetstreamext.BatchCommitHeader] = []string{"1"}
		}
		// No retries by nats.go: it sends a publish answered "no
		// responders" again on its own, behind the writes published
		// after it, and reports it stored there, out of the order
		// begun. The acker settles such a write instead (recover).
		f, err := q.s.js.PublishMsgAsync(out, jetstream.WithStallWait(q.s.cfg.opTimeout), jetstream.WithRetryAttempts(0))
		if err != nil {
			return err
		}
		*ack = f
	}
	return nil
}

// acker reports the queue's asynchronous writes in the order they were
// made, each once its ack came, its ctx ended or the queue closed. A
// write the stream did not store for a passing reason, or whose ack did
// not come within the op timeout, stops the pipeline (recover).
func (q *queue) acker() {
	defer q.awg.Done()
	for {
		q.amu.Lock()
		if len(q.inflight) == 0 {
			q.acking = false
			q.amu.Unlock()
			return
		}
		w := q.inflight[0]
		q.inflight[0] = nil
		q.inflight = q.inflight[1:]
		q.amu.Unlock()
		if w.deferred {
			first, err := q.write(w.ctx, w.msgs, false)
			q.amu.Lock()
			q.deferred--
			q.amu.Unlock()
			w.done(first, err)
			continue
		}
		first, f, err := q.awaitAck(w, time.Now().Add(q.s.cfg.opTimeout))
		if f == fateDone {
			w.done(first, err)
			continue
		}
		q.recover(w, err, f)
	}
}

// fate is what an asynchronous write's ack says of it.
type fate int

const (
	fateDone      fate = iota // stored, or failed for good: reported as is
	fateNotStored             // nothing of it stored, for a passing reason
	fateUnknown               // no answer in time
)

// recover settles a pipeline whose write w was not stored (fateNotStored:
// an atomic batch the stream's leader dropped, "incomplete", when it
// stepped down; no responders during an election) or got no answer in
// time (fateUnknown: its publish went to a leader that stepped down),
// while the writes behind it were published already and may have been
// stored. Writing w again after them would store it out of order, so:
// new writes wait in line (deferred) meanwhile; the writes published
// behind w are waited for (up to the op timeout); each one of unknown
// outcome is looked for in the stream (by its Nats-Msg-Id, after the
// stream's end known when it was published). Then each write, in order,
// is reported as stored where it was found or acknowledged; one not
// stored is written again (as Write does, in place) if no write behind
// it may have been stored, and otherwise fails: for good if the stream
// surely did not store it, with its outcome unknown if it was not found.
func (q *queue) recover(w *inflight, err error, f fate) {
	q.amu.Lock()
	q.recovering = true
	n := 0
	for n < len(q.inflight) && !q.inflight[n].deferred {
		n++
	}
	items := append([]*inflight{w}, q.inflight[:n]...)
	clear(q.inflight[:n])
	q.inflight = q.inflight[n:]
	q.amu.Unlock()
	defer func() {
		q.amu.Lock()
		q.recovering = false
		q.amu.Unlock()
	}()

	type outcome struct {
		first int64
		err   error
		f     fate // fateUnknown after the look: not found
	}
	outs := make([]outcome, len(items))
	outs[0] = outcome{err: err, f: f}
	deadline := time.Now().Add(q.s.cfg.opTimeout)
	for i := 1; i < len(items); i++ {
		first, f, err := q.awaitAck(items[i], deadline)
		outs[i] = outcome{first: first, err: err, f: f}
	}
	for i, it := range items {
		if outs[i].f != fateUnknown {
			continue
		}
		first, ok, err := q.findAsync(it)
		switch {
		case err != nil:
			outs[i].err = &ferry.Error{Op: fmt.Sprintf("natsstore: write %s: outcome unknown (%v), looking for it", q.id, outs[i].err), Err: err}
			outs[i].f = fateDone
		case ok:
			outs[i] = outcome{first: first, f: fateDone}
		}
	}
	// mayLater[i]: a write behind items[i] was or may have been stored.
	mayLater := make([]bool, len(items)+1)
	for i := len(items) - 1; i >= 0; i-- {
		o := outs[i]
		mayLater[i] = mayLater[i+1] || (o.f == fateDone && o.err == nil) || o.f == fateUnknown ||
			(o.f == fateDone && isUnknownOutcome(o.err))
	}
	op := fmt.Sprintf("natsstore: write %s", q.id)
	for i, it := range items {
		o := outs[i]
		switch {
		case o.f == fateDone:
			it.done(o.first, o.err)
		case mayLater[i+1] && o.f == fateNotStored:
			it.done(0, &ferry.Error{Op: op + ": not stored, and a write behind it was", Err: o.err})
		case mayLater[i+1]:
			it.done(0, &ferry.Error{Op: op + ": outcome unknown (not found), and a write behind it was stored", Err: o.err})
		default:
			first, err := q.write(it.ctx, it.msgs, false)
			it.done(first, err)
		}
	}
}

// isUnknownOutcome: err reports a write whose outcome is unknown.
func isUnknownOutcome(err error) bool {
	var fe *ferry.Error
	return errors.As(err, &fe) && strings.Contains(fe.Op, "outcome unknown")
}

// findAsync looks for w's first message in the stream after the end
// known when w was published: stored (w's messages stamped, the first
// offset returned) or not found.
func (q *queue) findAsync(w *inflight) (int64, bool, error) {
	ctx, cancel := q.s.cfg.bound(w.ctx)
	defer cancel()
	m := w.msgs[0]
	off, at, err := q.locate(ctx, w.hint, q.natsMsgID(m), m.ID, false)
	if errors.Is(err, errNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	for j, m := range w.msgs {
		m.Offset, m.StoreUnixNano = off+int64(j), at
	}
	q.advance(off + int64(len(w.msgs)))
	return off, true, nil
}

// notStored: an asynchronous write the stream refused for a passing
// reason, storing nothing of it.
func notStored(err error) bool {
	code, _ := apiCode(err)
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		code == jetstreamext.JSErrCodeAtomicPublishTooManyInflight || code == jetstreamext.JSErrCodeBatchPublishTooManyInflight ||
		code == jetstreamext.JSErrCodeBatchPublishIncomplete || code == 10008 /* cluster not available */
}

// awaitAck waits for w's ack, until deadline, and stamps its messages'
// offsets.
func (q *queue) awaitAck(w *inflight, deadline time.Time) (int64, fate, error) {
	if w.err != nil {
		return 0, fateDone, w.err
	}
	if w.ack == nil { // an empty write
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.next, fateDone, nil
	}
	op := fmt.Sprintf("natsstore: write %s", q.id)
	select { // an ack that came wins over a ctx or Close that came too
	case a := <-w.ack.Ok():
		first, err := q.stamp(w, a)
		return first, fateDone, err
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case a := <-w.ack.Ok():
		first, err := q.stamp(w, a)
		return first, fateDone, err
	case err := <-w.ack.Err():
		switch {
		case isFull(err):
			return 0, fateDone, &ferry.Error{Op: op, Err: ferry.ErrQueueFull}
		case isTooLarge(err):
			return 0, fateDone, &ferry.Error{Op: op, Err: fmt.Errorf("%w: %v", ferry.ErrMessageTooLarge, err)}
		case q.isClosed() || w.ctx.Err() != nil:
		case notStored(err):
			return 0, fateNotStored, err
		case isAmbiguous(err):
			return 0, fateUnknown, err
		}
		return 0, fateDone, &ferry.Error{Op: op + ": outcome unknown", Err: err}
	case <-t.C:
		if q.isClosed() || w.ctx.Err() != nil {
			return 0, fateDone, &ferry.Error{Op: op + ": outcome unknown", Err: ferry.ErrClosed}
		}
		return 0, fateUnknown, fmt.Errorf("no ack within %v", q.s.cfg.opTimeout)
	case <-w.ctx.Done():
		return 0, fateDone, &ferry.Error{Op: op + ": outcome unknown", Err: w.ctx.Err()}
	case <-q.done: // Close waits for the outcome, up to the op timeout
	}
	t.Reset(q.s.cfg.opTimeout)
	select {
	case a := <-w.ack.Ok():
		first, err := q.stamp(w, a)
		return first, fateDone, err
	case err := <-w.ack.Err():
		return 0, fateDone, &ferry.Error{Op: op + ": outcome unknown", Err: err}
	case <-w.ctx.Done():
		return 0, fateDone, &ferry.Error{Op: op + ": outcome unknown", Err: w.ctx.Err()}
	case <-t.C:
		return 0, fateDone, &ferry.Error{Op: op + ": outcome unknown", Err: ferry.ErrClosed}
	}
}

// stamp sets the offsets of w's messages from its ack and returns the
// first. A single message acknowledged as a duplicate is reported as
// Write reports it (as the first copy, or at its own copy: ours).
func (q *queue) stamp(w *inflight, a *jetstream.PubAck) (int64, error) {
	last := int64(a.Sequence) - 1
	if a.Duplicate && len(w.msgs) == 1 {
		p := &plan{msgs: w.msgs, keep: []int{0}, out: []*nats.Msg{nil}}
		ctx := w.ctx
		if ctx.Err() != nil { // the outcome is known: find the copy still
			ctx = context.Background()
		}
		ours, err := q.settleSingle(ctx, p, last, false)
		if err != nil {
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s: a duplicate of offset %d, getting it", q.id, last), Err: err}
		}
		if !ours {
			q.mu.Lock()
			defer q.mu.Unlock()
			return q.next, nil
		}
	}
	first := last - int64(len(w.msgs)) + 1
	for i, m := range w.msgs {
		m.Offset = first + int64(i)
	}
	q.advance(last + 1)
	return first, nil
}
