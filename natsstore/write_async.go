package natsstore

import (
	"context"
	"fmt"
	"strconv"
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
	err      error
	done     func(int64, error)
}

// WriteAsync implements [ferry.AsyncWriter]: it publishes msgs as Write
// does (one message with its Nats-Msg-Id, several as one atomic batch),
// but without waiting for the ack, so that one goroutine's writes are
// pipelined on the connection; the stream stores them in the order they
// were published. A goroutine of the queue's (the acker, running while
// writes are in flight) waits for the acks in that order and calls done.
// Unlike Write, a write that fails is not tried again: done gets the
// error, and for a timeout or ctx's end the write may have been stored;
// writes after it go on. A full stream ([ferry.Block]) is
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
		w.deferred = q.deferred > 0 || q.keyedBatch(msgs)
		q.amu.Unlock()
		if !w.deferred {
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
		out := q.natsMsg(m)
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
		f, err := q.s.js.PublishMsgAsync(out, jetstream.WithStallWait(q.s.cfg.opTimeout))
		if err != nil {
			return err
		}
		*ack = f
	}
	return nil
}

// acker reports the queue's asynchronous writes in the order they were
// made, each once its ack came, its ctx ended or the queue closed.
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
		var first int64
		var err error
		if w.deferred {
			first, err = q.write(w.ctx, w.msgs, false)
			q.amu.Lock()
			q.deferred--
			q.amu.Unlock()
		} else {
			first, err = q.awaitAck(w)
		}
		w.done(first, err)
	}
}

// awaitAck waits for w's ack and stamps its messages' offsets.
func (q *queue) awaitAck(w *inflight) (int64, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.ack == nil { // an empty write
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.next, nil
	}
	op := fmt.Sprintf("natsstore: write %s", q.id)
	select { // an ack that came wins over a ctx or Close that came too
	case a := <-w.ack.Ok():
		return q.stamp(w, a)
	default:
	}
	select {
	case a := <-w.ack.Ok():
		return q.stamp(w, a)
	case err := <-w.ack.Err():
		switch {
		case isFull(err):
			return 0, &ferry.Error{Op: op, Err: ferry.ErrQueueFull}
		case isTooLarge(err):
			return 0, &ferry.Error{Op: op, Err: fmt.Errorf("%w: %v", ferry.ErrMessageTooLarge, err)}
		}
		return 0, &ferry.Error{Op: op + ": outcome unknown", Err: err}
	case <-w.ctx.Done():
		return 0, &ferry.Error{Op: op + ": outcome unknown", Err: w.ctx.Err()}
	case <-q.done: // Close waits for the outcome, up to the op timeout
	}
	t := time.NewTimer(q.s.cfg.opTimeout)
	defer t.Stop()
	select {
	case a := <-w.ack.Ok():
		return q.stamp(w, a)
	case err := <-w.ack.Err():
		return 0, &ferry.Error{Op: op + ": outcome unknown", Err: err}
	case <-w.ctx.Done():
		return 0, &ferry.Error{Op: op + ": outcome unknown", Err: w.ctx.Err()}
	case <-t.C:
		return 0, &ferry.Error{Op: op + ": outcome unknown", Err: ferry.ErrClosed}
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
