package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// The outputs of a transaction log's records: written by the applier
// outside memory (after their inputs finished), or by the call itself
// in memory and by a take.

// maxPending bounds the records whose outputs wait for the applier: a
// batch of records waits for it to catch up (outputs that cannot be
// written, to a full topic say, hold the handlers back as they did when
// each call wrote its own).
const maxPending = 4096

// The applier writes outputs once applyBatch records are pending, or
// applyLinger after fewer were.
const (
	applyBatch  = 256
	applyLinger = time.Millisecond
)

// enqueue gives the applier batch's records, just written to the log,
// and starts it if it is not running; it waits while the applier is
// maxPending records behind. When the applier gave the queue up, their
// outputs are not this holding's to write: each gets its error. The
// batch's writer.
func (tl *txnLog) enqueue(batch []*txnPending) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.applyErr == nil && tl.stopped {
		tl.applyErr = errGivenUp // a call the holding's end did not wait for
	}
	if tl.applyErr != nil {
		for _, q := range batch {
			q.aerr = tl.applyErr
		}
		return
	}
	for _, q := range batch {
		q.queued = true
	}
	tl.pend = append(tl.pend, batch...)
	if !tl.applying {
		tl.applying = true
		tl.awg.Add(1)
		go tl.applier()
	} else {
		select {
		case tl.kick <- struct{}{}: // an idle applier goes on
		default:
		}
	}
	for len(tl.pend) > maxPending && tl.applyErr == nil {
		ch := tl.progressed()
		tl.mu.Unlock()
		<-ch
		tl.mu.Lock()
	}
}

// progressed returns the channel the applier's next step closes. tl.mu
// must be held.
func (tl *txnLog) progressed() chan struct{} {
	if tl.progress == nil {
		tl.progress = make(chan struct{})
	}
	return tl.progress
}

// signal closes the progress channel. tl.mu must be held.
func (tl *txnLog) signal() {
	if tl.progress != nil {
		close(tl.progress)
		tl.progress = nil
	}
}

// applier writes the outputs of the pending records, all it has at each
// step, in log order, then calls their hooks; it ends when none are
// left. If it cannot write them (apply tries again until the holding's
// handlers' context ends), the holding gives the queue up: the next owner
// writes them again from the log.
func (tl *txnLog) applier() {
	defer tl.awg.Done()
	ctx := tl.r.hctx
	for {
		tl.mu.Lock()
		if n := len(tl.pend); n > 0 && n < applyBatch && ctx.Err() == nil {
			// Let a few batches of records gather: one write (one
			// fdatasync) per target queue for them all. The handlers do
			// not wait for it.
			tl.mu.Unlock()
			time.Sleep(applyLinger)
			tl.mu.Lock()
		}
		if len(tl.pend) == 0 {
			tl.mu.Unlock()
			if tl.idle(ctx) {
				return
			}
			continue
		}
		ps := slices.Clone(tl.pend)
		tl.mu.Unlock()
		recs := make([]txnRecord, len(ps))
		for i, p := range ps {
			recs[i] = txnRecord{at: p.at, outs: p.outs}
		}
		err := tl.apply(ctx, recs)
		tl.mu.Lock()
		if err != nil {
			// The records stay pending, below the floor, for the next owner.
			tl.applyErr = err
			failed := slices.Clone(tl.pend)
			tl.applying = false
			tl.signal()
			tl.mu.Unlock()
			for _, p := range failed {
				sent(p.ctx, p.sent, &Error{Op: "outbox send", Err: fmt.Errorf("not written by this call: its queue was given up (its next owner writes them): %w", err)})
			}
			if ctx.Err() == nil { // else the holding is lost, or ended
				tl.r.lose()
			}
			return
		}
		rest := copy(tl.pend, tl.pend[len(ps):])
		clear(tl.pend[rest:])
		tl.pend = tl.pend[:rest]
		tl.signal()
		tl.mu.Unlock()
		for _, p := range ps {
			sent(p.ctx, p.sent, nil)
		}
	}
}

// idle waits for more records, up to floorEvery: it returns false when
// some came. Else the applier ends (true), having committed the log's
// floor past the records it wrote, which the committer does only as
// inputs finish.
func (tl *txnLog) idle(ctx context.Context) bool {
	t := time.NewTimer(floorEvery)
	defer t.Stop()
	select {
	case <-tl.kick:
	case <-t.C:
	case <-ctx.Done():
	}
	tl.mu.Lock()
	if len(tl.pend) > 0 && ctx.Err() == nil {
		tl.mu.Unlock()
		return false
	}
	tl.applying = false
	tl.signal()
	tl.mu.Unlock()
	if ctx.Err() == nil {
		tl.r.commitFloor()
	}
	return true
}

// quiesce waits until the applier has written every pending record's
// outputs, or gave up, or ctx ends: a release's last commit then commits
// the floor past them.
func (tl *txnLog) quiesce(ctx context.Context) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for len(tl.pend) > 0 && tl.applyErr == nil {
		ch := tl.progressed()
		tl.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			tl.mu.Lock()
			return
		}
		tl.mu.Lock()
	}
}

// stop waits for the applier to end (the holding's handlers' context
// is cancelled); none starts after it.
func (tl *txnLog) stop() {
	tl.mu.Lock()
	tl.stopped = true
	tl.mu.Unlock()
	tl.awg.Wait()
}

// txnRecord is a record's outputs to write: the record's log offset,
// its outputs.
type txnRecord struct {
	at   int64
	outs []decodedOutput
}

// apply writes the outputs of records recs, each with its deduplication
// key (its own, or one derived from its record's log offset and its
// index), so that writing them again stores none twice; one write per
// target queue. An output whose topic is gone or was created again
// since is dropped and reported. A failed write is tried again, with
// backoff, until ctx ends.
func (tl *txnLog) apply(ctx context.Context, recs []txnRecord) error {
	for try := 1; ; try++ {
		err := tl.applyOnce(ctx, recs)
		if err == nil {
			return nil
		}
		tl.r.m.report(&Error{Op: fmt.Sprintf("write outputs of transaction log %s offsets %d to %d", tl.lq.ID(), recs[0].at, recs[len(recs)-1].at), Err: err})
		t := time.NewTimer(backoff(10*time.Millisecond, time.Second, try))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (tl *txnLog) applyOnce(ctx context.Context, recs []txnRecord) error {
	b := tl.r.m.b
	type target struct {
		t    *topicState
		q    int
		ems  []*EnhancedMessage // written
		srcs []*EnhancedMessage // the outputs they copy
	}
	var targets []target
	prefix := "%txn:" + tl.name + ":" + strconv.Itoa(tl.r.q) + ":"
	var keyBuf [192]byte // the outputs' keys built on the stack (a longer log name grows it)
	for _, rec := range recs {
		var key []byte
		for i := range rec.outs {
			o := &rec.outs[i]
			t, err := b.topic(o.topic)
			if errors.Is(err, ErrTopicNotFound) || err == nil && o.inc != 0 && t.meta.Incarnation != 0 && t.meta.Incarnation != o.inc {
				tl.r.m.report(&Error{Op: fmt.Sprintf("write output %d of transaction log %s offset %d: dropped", i, tl.lq.ID(), rec.at), Err: fmt.Errorf("%w: %q (deleted, or created again since)", ErrTopicNotFound, o.topic)})
				continue
			}
			if err != nil {
				return err
			}
			w := *o.em // a fresh message each time: the queue keeps it
			if w.DedupKey == "" {
				if key == nil {
					key = strconv.AppendInt(append(keyBuf[:0], prefix...), rec.at, 10)
					key = append(key, ':')
				}
				w.DedupKey = string(strconv.AppendInt(key, int64(i), 10))
			}
			q := o.q % len(t.queues)
			if !o.at.IsZero() && o.at.After(b.time.Now()) {
				if _, err := b.delay.place(ctx, &w, QueueID{Topic: t.meta.Name, Queue: q}, o.at, true); err != nil {
					return err
				}
				written(o.em, &w)
				continue
			}
			j := slices.IndexFunc(targets, func(g target) bool { return g.t == t && g.q == q })
			if j < 0 {
				targets = append(targets, target{t: t, q: q})
				j = len(targets) - 1
			}
			targets[j].ems = append(targets[j].ems, &w)
			targets[j].srcs = append(targets[j].srcs, o.em)
		}
	}
	for _, g := range targets {
		if _, err := writeAt(ctx, g.t.queues[g.q], g.ems, b.clock.now()); err != nil {
			return err
		}
		for i, w := range g.ems {
			written(g.srcs[i], w)
		}
	}
	return nil
}

// written gives em, an output, what the write of its copy w set: its
// Queue, Offset, StoreUnixNano (and ID: those of the first copy when w
// was a duplicate), for the hooks' OnSent (see sent).
func written(em, w *EnhancedMessage) {
	em.Queue, em.Offset, em.ID, em.StoreUnixNano = w.Queue, w.Offset, w.ID, w.StoreUnixNano
}
