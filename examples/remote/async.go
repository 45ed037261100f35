package remote

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// asyncWrite is one WriteAsync waiting to be sent or reported.
type asyncWrite struct {
	ctx  context.Context
	msgs []*ferry.EnhancedMessage
	cb   func(first int64, err error)
	err  error // refused before sending
	slot bool  // holds a place in slots
}

// maxCallBytes bounds the encoded messages the sender puts in one call.
const maxCallBytes = 8 << 20

// WriteAsync begins a write of msgs and returns (see [ferry.AsyncWriter]).
// Writes begun while a call is in flight go together in the next call,
// which the server writes as one batch (one group commit) where it can,
// each write still whole or not at all, and in the order begun. One
// goroutine per queue sends the calls, started on demand and exiting
// when there is nothing to send. WriteAsync waits while [WithMaxAsync]
// writes are pending, until one is reported, ctx ends (reported as its
// error) or the queue closes.
func (q *Queue) WriteAsync(ctx context.Context, msgs []*ferry.EnhancedMessage, done func(first int64, err error)) {
	if done == nil {
		return // nobody to tell: a caller's bug, and nothing written
	}
	w := &asyncWrite{ctx: ctx, msgs: msgs, cb: done}
	switch {
	case ctx == nil:
		w.err = &ferry.Error{Op: "remote " + q.opName("write async"), Err: fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)}
	default:
		w.err = q.checkBatch("write async", msgs)
	}
	if w.err == nil {
		select {
		case q.slots <- struct{}{}:
			w.slot = true
		case <-ctx.Done():
			w.err = ctx.Err()
		case <-q.ctx.Done():
			// closing: reported below
		}
	}
	q.amu.Lock()
	if q.aclosed {
		q.amu.Unlock()
		w.done(0, &ferry.Error{Op: "remote " + q.opName("write async"), Err: ferry.ErrClosed})
		if w.slot {
			<-q.slots
		}
		return
	}
	q.pending = append(q.pending, w)
	if !q.sending {
		q.sending = true
		q.sender.Add(1)
		go q.sendLoop()
	}
	q.amu.Unlock()
}

// done reports w's outcome.
func (w *asyncWrite) done(first int64, err error) {
	w.cb(first, err)
}

// sendLoop sends the pending writes, a call at a time, until there are
// none (or the queue closes: then Close reports what is left).
func (q *Queue) sendLoop() {
	defer q.sender.Done()
	for {
		q.amu.Lock()
		if len(q.pending) == 0 || q.ctx.Err() != nil {
			q.sending = false
			q.amu.Unlock()
			return
		}
		take, size := 0, 0
		for take < len(q.pending) && (take == 0 || size < maxCallBytes) && take < maxBatches {
			if w := q.pending[take]; w.err == nil {
				for _, m := range w.msgs {
					size += codec.Size(m)
				}
			}
			take++
		}
		ws := q.pending[:take:take]
		q.pending = q.pending[take:]
		q.amu.Unlock()
		q.sendAsync(ws)
	}
}

// sendAsync sends the writes of ws not refused yet in one call and
// reports every one of ws in order.
func (q *Queue) sendAsync(ws []*asyncWrite) {
	var batches [][]*ferry.EnhancedMessage
	idx := make([]int, len(ws)) // w's batch in the call, or -1
	for i, w := range ws {
		idx[i] = -1
		if w.err == nil && w.ctx.Err() != nil {
			w.err = w.ctx.Err() // cut off before it was sent: not stored
		}
		if w.err == nil {
			idx[i] = len(batches)
			batches = append(batches, w.msgs)
		}
	}
	var res []writeResult
	var err error
	if len(batches) > 0 {
		// The call is bounded by the queue's life, not by any one
		// write's ctx: it carries the others too.
		res, err = q.send(q.ctx, "write async", batches, false)
	}
	for i, w := range ws {
		var first int64
		switch {
		case idx[i] < 0:
		case err != nil:
			w.err = err
		default:
			first, w.err = res[idx[i]].first, res[idx[i]].err
		}
		if w.err != nil {
			first = 0
		}
		w.done(first, w.err)
		if w.slot {
			<-q.slots
		}
	}
}

func unmarshalResponse(op string, b []byte, resp any) error {
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(b, resp); err != nil {
		return &ferry.Error{Op: "remote " + op, Err: fmt.Errorf("%w: response: %w", ferry.ErrCorrupt, err)}
	}
	return nil
}
