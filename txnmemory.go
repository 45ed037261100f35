package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// commitMemory commits in memory: the record (whose body says its outputs
// were written with it) and the outputs, grouped by queue, are one
// atomic write (writeAtomic), after a check under its locks that no later
// owner wrote to the log. So a take sees the record and the outputs or
// neither, writes none of them again, and the outputs need no keys of
// their own (a key the sender gave is checked as ever). A write that
// waits for room in a full queue waits with nothing written.
func (tl *txnLog) commitMemory(ctx context.Context, r *queueRun, off int64, outs []txnOutput, mp *memParts) error {
	lq := mp.qs[0]
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
	fence := func() error { // lq locked: a later owner's marker or record fences this holding out
		for _, m := range lq.tailLocked(tl.next) {
			if _, _, token, err := parseTxnTag(m.Tag); err == nil && token > tl.token {
				return errTxnFenced
			}
		}
		return nil
	}
	tl.wmu.Lock()
	ems[0] = tl.newRecord(tl.blockTag(off), txnWrittenBody)
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
		tl.applied = append(tl.applied, txnApplied{at: at, off: off})
		tl.next, tl.last = at+1, at
	} else if errors.Is(err, ErrFenced) {
		tl.fenced = true
	}
	tl.mu.Unlock()
	tl.wmu.Unlock()
	if err != nil {
		return tl.notWritten(ctx, r, off, outs, err)
	}
	for i, p := range parts[1:] {
		if p.closed {
			id := mp.qs[i+1].ID()
			tl.r.m.report(&Error{Op: fmt.Sprintf("write outputs of transaction log %s offset %d to %s: dropped", tl.lq.ID(), parts[0].first, id), Err: fmt.Errorf("%w: %q (deleted, or created again since)", ErrTopicNotFound, id.Topic)})
		}
	}
	sent(ctx, outs, nil)
	return tl.landed(r)
}
