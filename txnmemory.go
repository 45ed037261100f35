package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// memParts is an atomic write's queues in memory: the log's, then one
// per output queue (writeAtomic takes at most 8).
type memParts struct {
	qs [8]*MemoryQueue
	n  int
}

// memoryParts reports whether outs commit in memory (commitMemory): the
// log and every output's queue are memory queues, no output is delayed,
// and they go to at most 7 queues; it lists the queues in mp.
func (tl *txnLog) memoryParts(outs []txnOutput, mp *memParts) bool {
	lq, ok := tl.lq.(*MemoryQueue)
	if !ok {
		return false
	}
	mp.qs[0], mp.n = lq, 1
	for i := range outs {
		o := &outs[i]
		q, ok := o.t.queues[o.q].(*MemoryQueue)
		if !ok || !o.at.IsZero() {
			return false
		}
		if !slices.Contains(mp.qs[:mp.n], q) {
			if mp.n == len(mp.qs) {
				return false
			}
			mp.qs[mp.n] = q
			mp.n++
		}
	}
	return true
}

// merge adds o's output queues to mp's; false, mp unchanged, when
// they would be more than an atomic write takes.
func (mp *memParts) merge(o *memParts) bool {
	m := *mp
	for _, q := range o.qs[1:o.n] {
		if slices.Contains(m.qs[:m.n], q) {
			continue
		}
		if m.n == len(m.qs) {
			return false
		}
		m.qs[m.n] = q
		m.n++
	}
	*mp = m
	return true
}

// commitMemory commits in memory: the record (whose body says its outputs
// were written with it) and the outputs, grouped by queue, are one
// atomic write (writeAtomic), after a check under its locks that no later
// owner wrote to the log. So a take sees the record and the outputs or
// neither, writes none of them again, and the outputs need no keys of
// their own (a key the sender gave is checked as ever). A write that
// waits for room in a full queue waits with nothing written.
func (tl *txnLog) commitMemory(ctx context.Context, r *queueRun, off int64, outs []txnOutput, mp *memParts) error {
	var pbuf [8]memPart
	var ebuf [8]*EnhancedMessage // the messages of a small commit
	ems := ebuf[:0]
	if len(outs)+1 > len(ebuf) {
		ems = make([]*EnhancedMessage, 0, len(outs)+1)
	}
	ems = append(ems, nil) // the record, made under tl.wmu
	// pbuf by index, not through a slice: a store through a slice would
	// take ebuf to the heap.
	pbuf[0].msgs = ems[:1:1]
	for k, q := range mp.qs[1:mp.n] {
		from := len(ems)
		for i := range outs {
			if outs[i].t.queues[outs[i].q] == Queue(q) {
				ems = append(ems, outs[i].em)
			}
		}
		pbuf[k+1].msgs = ems[from:len(ems):len(ems)]
	}
	parts := pbuf[:mp.n]
	if err := tl.writeMemory(off, off, txnWrittenBody, mp, parts); err != nil {
		return tl.notWritten(ctx, r, off, outs, err)
	}
	tl.reportDropped(mp, parts)
	sent(ctx, outs, nil)
	return tl.landed(r)
}

// writeMemory writes parts to mp's queues as one atomic write, parts[0]
// the record's (its one message made here, under tl.wmu: tagged for
// input off, with body), once a check under the queues' locks finds no
// later owner's record or marker in the log. The record is noted
// applied for inputs up to last.
func (tl *txnLog) writeMemory(off, last int64, body []byte, mp *memParts, parts []memPart) error {
	lq := mp.qs[0]
	fence := func() error { // lq locked: a later owner's marker or record fences this holding out
		for _, m := range lq.tailLocked(tl.next) {
			if _, _, token, err := parseTxnTag(m.Tag); err == nil && token > tl.token {
				return errTxnFenced
			}
		}
		return nil
	}
	tl.wmu.Lock()
	parts[0].msgs[0] = tl.newRecord(tl.blockTag(off), body)
	tl.mu.Lock()
	fenced := tl.fenced
	tl.mu.Unlock()
	err := errTxnFenced
	if !fenced {
		err = writeAtomic(tl.r.hctx, mp.qs[:mp.n], parts, fence)
	}
	tl.mu.Lock()
	if err == nil {
		at := parts[0].first
		tl.applied = append(tl.applied, txnApplied{at: at, off: last})
		tl.next, tl.last = at+1, at
	} else if errors.Is(err, ErrFenced) {
		tl.fenced = true
	}
	tl.mu.Unlock()
	tl.wmu.Unlock()
	return err
}

// reportDropped reports the outputs of a write to mp's queues that were
// dropped: their queue was closed (its topic deleted, or created again).
func (tl *txnLog) reportDropped(mp *memParts, parts []memPart) {
	for i, p := range parts[1:] {
		if p.closed {
			id := mp.qs[i+1].ID()
			tl.r.m.report(&Error{Op: fmt.Sprintf("write outputs of transaction log %s offset %d to %s: dropped", tl.lq.ID(), parts[0].first, id), Err: fmt.Errorf("%w: %q (deleted, or created again since)", ErrTopicNotFound, id.Topic)})
		}
	}
}

// txnStage holds a worker's Transactional calls in memory (see
// memoryParts) until the end of the batch it takes (see runBatch): the
// batch's inputs finish together then, and their calls commit together
// just before, one record for all their inputs with all their outputs,
// in one atomic write: one record and one write a batch rather than a
// call. The outputs become visible at the commit, by the time the inputs
// finish. A call whose
// queues would make the write too wide commits what is held first; a
// commit of several that one call's outputs do not fit commits each call
// on its own. What is held commits once it is txnHold old when a call
// returns: a slow call's outputs wait for no other call.
type txnStage struct {
	r     *queueRun
	since time.Time // when the calls held began to be (the batch's start, or the last commit)
	calls []stagedCall
	mp    memParts // the log's queue, then the outputs' queues
	offs  []int64
	ems   []*EnhancedMessage
	// unfinished lists the inputs of calls held here whose commit failed,
	// in the order they were held: the batch does not finish them.
	unfinished []*EnhancedMessage
}

// stagedCall is a call held by a txnStage: its input and attempt, its
// outputs and the context their hooks get.
type stagedCall struct {
	msg     *EnhancedMessage
	attempt int
	outs    []txnOutput
	ctx     context.Context
}

// add holds c, a call of r that succeeded, for the batch's commit; false
// when its outputs do not commit in memory (the call commits now, as
// outside a batch).
func (st *txnStage) add(d *deliverer, dctx *deliveryCtx, r *queueRun, c stagedCall) bool {
	var mp memParts
	if !r.tl.memoryParts(c.outs, &mp) {
		return false
	}
	now := d.m.b.clock.now()
	if len(st.calls) > 0 && (st.r != r || !st.mp.merge(&mp)) {
		st.flush(d, dctx)
		st.since = now
	}
	if len(st.calls) == 0 {
		st.r, st.mp = r, mp
	}
	st.calls = append(st.calls, c)
	if now.Sub(st.since) >= txnHold {
		st.flush(d, dctx)
		st.since = now
	}
	return true
}

// txnHold is how long at most a txnStage holds calls before a call that
// returns has them commit: the outputs of calls faster than that wait
// for at most about twice that, those of slower calls for none.
const txnHold = time.Millisecond

// start starts holding a batch's calls.
func (st *txnStage) start(d *deliverer) { st.since = d.m.b.clock.now() }

// flush commits the calls held. A call whose commit fails goes on as a
// failed call: given up (back unfinished), retried or dead-lettered; its
// input joins st.unfinished unless that finished it.
func (st *txnStage) flush(d *deliverer, dctx *deliveryCtx) {
	calls := st.calls
	if len(calls) == 0 {
		return
	}
	r := st.r
	tl := r.tl
	defer func() {
		clear(calls)
		st.calls, st.r = calls[:0], nil
	}()
	failed := func(c *stagedCall, err error) {
		dctx.handled--
		dctx.failed++
		if !d.failure(r, c.msg, c.attempt, err) {
			st.unfinished = append(st.unfinished, c.msg)
		}
	}
	if len(calls) == 1 {
		c := &calls[0]
		if err := tl.commitMemory(c.ctx, r, c.msg.Offset, c.outs, &st.mp); err != nil {
			failed(c, err)
		}
		return
	}
	err := tl.commitStaged(st)
	switch {
	case err == nil:
		if err := tl.landed(r); err != nil {
			for i := range calls {
				failed(&calls[i], err)
			}
		}
	case errors.Is(err, ErrMessageTooLarge) || errors.Is(err, ErrInvalidMessage):
		// Nothing written: each call commits on its own, and the one
		// whose outputs do not fit fails alone.
		for i := range calls {
			c := &calls[i]
			if err := tl.commit(c.ctx, r, c.msg.Offset, c.outs); err != nil {
				failed(c, err)
			}
		}
	default:
		for i := range calls {
			c := &calls[i]
			failed(c, tl.notWritten(c.ctx, r, c.msg.Offset, c.outs, err))
		}
	}
}

// commitStaged writes the record of st's calls and their outputs, each
// queue's in the order of the calls, as one atomic write (see
// commitMemory).
func (tl *txnLog) commitStaged(st *txnStage) error {
	offs, total := st.offs[:0], 1
	for i := range st.calls {
		offs = append(offs, st.calls[i].msg.Offset)
		total += len(st.calls[i].outs)
	}
	slices.Sort(offs)
	st.offs = offs
	ems := st.ems[:0]
	if cap(ems) < total {
		ems = make([]*EnhancedMessage, 0, total)
	}
	var pbuf [8]memPart
	ems = append(ems, nil) // the record, made under tl.wmu
	pbuf[0].msgs = ems[:1:1]
	for k, q := range st.mp.qs[1:st.mp.n] {
		from := len(ems)
		for i := range st.calls {
			outs := st.calls[i].outs
			for j := range outs {
				if outs[j].t.queues[outs[j].q] == Queue(q) {
					ems = append(ems, outs[j].em)
				}
			}
		}
		pbuf[k+1].msgs = ems[from:len(ems):len(ems)]
	}
	parts := pbuf[:st.mp.n]
	err := tl.writeMemory(offs[0], offs[len(offs)-1], encodeWrittenInputs(offs), &st.mp, parts)
	clear(ems)
	st.ems = ems[:0]
	if err != nil {
		return err
	}
	tl.reportDropped(&st.mp, parts)
	for i := range st.calls {
		sent(st.calls[i].ctx, st.calls[i].outs, nil)
	}
	return nil
}

// finishing returns finished, a batch's inputs that it finishes, less
// those of st.unfinished, and empties that.
func (st *txnStage) finishing(finished []*EnhancedMessage) []*EnhancedMessage {
	if len(st.unfinished) == 0 {
		return finished
	}
	kept, j := finished[:0], 0
	for _, m := range finished {
		if j < len(st.unfinished) && st.unfinished[j] == m {
			j++
			continue
		}
		kept = append(kept, m)
	}
	clear(finished[len(kept):])
	clear(st.unfinished)
	st.unfinished = st.unfinished[:0]
	return kept
}
