package ferry

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Fetching: a held queue's fetch loop reads batches from the queue into
// its buffer, parks at the end of a queue that can wake it, and serves
// Consumer.Seek.

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

// runTask runs the fetch loop's turn on a runner (see kick).
func (r *queueRun) runTask() { r.fetchLoop() }

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
		if r.h.held(holdPause) {
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
					r.skip, r.skipAt = nil, 0 // offsets that moved mean nothing any more
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
		if r.skipAt < len(r.skip) {
			batch = r.skipFinished(batch)
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

// skipFinished drops from batch the messages of the finished set the
// cursor was loaded with (the previous owner finished them).
func (r *queueRun) skipFinished(batch []*EnhancedMessage) []*EnhancedMessage {
	kept := batch[:0]
	for _, msg := range batch {
		for r.skipAt < len(r.skip) && r.skip[r.skipAt] < msg.Offset {
			r.skipAt++
		}
		if r.skipAt < len(r.skip) && r.skip[r.skipAt] == msg.Offset {
			r.skipAt++
			continue
		}
		kept = append(kept, msg)
	}
	clear(batch[len(kept):])
	return kept
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
	r.h.hold(holdSeek, true)
	defer func() {
		r.h.hold(holdSeek, false)
		if r.buf.Pending() > 0 {
			r.m.sched.push(r)
		}
	}()
	if !r.m.pull {
		r.dropWaiting() // OrderedByKey's messages not started yet: dropped with the buffered rest
		if err := r.buf.WaitDrained(r.ctx); err != nil {
			req.done <- ErrClosed
			return
		}
	}
	r.buf.Reset(req.to)
	r.commitMu.Lock()
	r.skip, r.skipAt = nil, 0 // the seek asks for what is there, handled or not
	if r.tl != nil {
		r.tl.forget()
	}
	err := r.commitCursor(r.ctx, req.to, nil, true)
	if err == nil {
		r.committed = req.to
	} else if r.ctx.Err() != nil {
		err = fmt.Errorf("queue given up while seeking: %w", ErrClosed) // a revoke or a loss came first
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
