package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// txnLog is a held queue's transaction log (see Transactional): queue q
// of the group's log topic, which only the holder of queue q writes (a
// former holder's late records are void, see takeTxn).
type txnLog struct {
	r     *queueRun
	name  string
	t     *topicState
	lq    Queue
	token uint64

	// wmu serializes the writes of a log in memory, where sharing a
	// write saves nothing: each record is written on its own, under it.
	wmu     sync.Mutex
	mu      sync.Mutex
	waiting []*txnPending // records waiting for the writer, in order
	writing bool          // a writer writes; the first waiting one writes next
	next    int64         // the log's next offset after this holding's last write
	last    int64         // the offset of this holding's last record (or its marker)
	fenced  bool          // a later owner's record is in the log: write nothing more
	// applied lists the records this holding applied or is applying
	// (log offset, input offset) whose input may not be committed yet:
	// the applied floor stays at or below the oldest.
	applied   []txnApplied
	committed int64 // the applied floor last committed
	// floorAt is when the floor was last committed: the committer's
	// commits commit it at most every floorEvery.
	floorAt time.Time

	// Outside memory, a record's outputs are written by the applier,
	// after the record is in the log and its input has finished: the
	// call waits for one write to stable storage, not two in a row. pend
	// lists the records whose outputs the applier has not written yet, in
	// log order (the floor stays at or below the first: a next owner
	// writes them again). applyErr is the write that made the applier
	// give the queue up; progress is closed at each of its steps.
	pend     []*txnPending
	applying bool
	applyErr error
	progress chan struct{}
	kick     chan struct{} // capacity 1: records for an idle applier
	stopped  bool          // the holding ended: no applier starts
	awg      sync.WaitGroup

	slab atomic.Pointer[envSlab] // the records' envelopes (see newRecord)
	tags []byte                  // the current block of the records' tags in memory (see blockTag); under wmu
}

// floorEvery is how often at most the committer commits a transaction
// log's floor with the cursor: each is one more write to the cursor store
// (a write and an fdatasync on filestore).
const floorEvery = 50 * time.Millisecond

// txnApplied is a record applied: its log offset, and its input's (the
// last of its inputs', for a record of several).
type txnApplied struct{ at, off int64 }

// txnPending is a record waiting to be written.
type txnPending struct {
	em   *EnhancedMessage
	off  int64           // input offset
	outs []decodedOutput // its outputs, written by the batch's writer or the applier
	ctx  context.Context // the call's, and its outputs, for their OnSent hooks
	sent []txnOutput
	at   int64         // where it was written
	err  error         // the record's write's
	aerr error         // its outputs' write's
	wake chan struct{} // closed when written (its outputs queued), or when it is to write
	lead bool
	// queued: the applier writes its outputs (and calls their hooks).
	queued bool
}

// errTxnFenced is a log write's when a later owner of the queue wrote to
// the log: this holding's lease is gone.
var errTxnFenced = fmt.Errorf("%w: a later owner of the queue wrote to its transaction log", ErrFenced)

// txnLogState returns the member's transaction log topic, with at least
// queues queues, creating or growing it.
func (m *groupMember) txnLogState(ctx context.Context, queues int) (*topicState, error) {
	name := m.cfg.txnLog
	t, err := m.b.topic(name)
	if errors.Is(err, ErrTopicNotFound) {
		if err := m.b.createSystemTopic(ctx, TopicMeta{Name: name, Queues: queues}); err != nil {
			return nil, err
		}
		t, err = m.b.topic(name)
	}
	if err != nil {
		return nil, err
	}
	if len(t.queues) < queues {
		if err := m.b.addQueues(ctx, name, queues); err != nil {
			return nil, err
		}
		if t, err = m.b.topic(name); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// takeTxn takes r's transaction log when r's queue was taken at start:
// it writes the take marker, then reads the log from the applied floor
// to the marker and finishes each input at or above start (and not in
// r.skip) that has a record there, with its last record: its outputs
// are written again (stored only if they were not) and the input joins
// r.skip. A record with a lower token than a record or marker before it
// is void: its writer had lost the queue (it wrote none of its outputs,
// see write).
func (r *queueRun) takeTxn(start int64) error {
	m := r.m
	lt, err := m.txnLogState(r.ctx, len(r.t.queues))
	if err != nil {
		return err
	}
	tl := &txnLog{r: r, name: lt.meta.Name, t: lt, lq: lt.queues[r.q], token: r.lease.Token(), kick: make(chan struct{}, 1)}
	from, err := tl.loadFloor(r.ctx)
	if err != nil {
		return err
	}
	mark := tl.newRecord(txnMarkerTag+strconv.FormatUint(tl.token, 10), nil)
	at, err := tl.lq.Write(r.ctx, []*EnhancedMessage{mark})
	if err != nil {
		return fmt.Errorf("write take marker: %w", err)
	}
	tl.next, tl.last, tl.committed = at+1, at, from
	oldest, _, err := queueOffsets(r.ctx, tl.lq)
	if err != nil {
		return err
	}
	type validRecord struct {
		msg *EnhancedMessage
		ins []int64 // its inputs (see recordInputs)
	}
	var valid []validRecord              // the valid records, in log order
	last := map[int64]*EnhancedMessage{} // input offset → its last valid record
	var fence uint64
	ignored := func(msg *EnhancedMessage, err error) {
		m.report(&Error{Op: fmt.Sprintf("take %s: transaction log %s offset %d ignored", r.id, tl.lq.ID(), msg.Offset), Err: err})
	}
	err = tl.read(r.ctx, max(from, oldest), at, func(msg *EnhancedMessage) {
		marker, off, token, err := parseTxnTag(msg.Tag)
		switch {
		case err != nil:
			ignored(msg, err)
		case token < fence:
			// void: written after a later owner's marker or record
		case marker:
			fence = token
		default:
			fence = token
			ins, err := recordInputs(off, msg.Body)
			if err != nil {
				// Its inputs, if not finished, are handled again: losing
				// its outputs beats guessing them.
				ignored(msg, err)
				return
			}
			valid = append(valid, validRecord{msg: msg, ins: ins})
			for _, in := range ins {
				if in >= start {
					last[in] = msg
				}
			}
		}
	})
	if err != nil {
		return err
	}
	// Every valid record's outputs are written again, in log order: the
	// former owner's applier may not have written them all, even for
	// inputs it finished and committed (stored once all the same: their
	// keys are the record's).
	recs := make([]txnRecord, 0, len(valid))
	for _, v := range valid {
		msg := v.msg
		outs, err := decodeTxnRecord(msg.Body)
		if err != nil {
			// Its input, if not finished, is handled again: losing its
			// outputs beats guessing them.
			ignored(msg, err)
			for _, in := range v.ins {
				if last[in] == msg {
					delete(last, in)
				}
			}
			continue
		}
		recs = append(recs, txnRecord{at: msg.Offset, outs: outs})
		// The floor keeps it until its inputs are committed, for a next
		// owner whose store may not say they finished.
		tl.applied = append(tl.applied, txnApplied{at: msg.Offset, off: v.ins[len(v.ins)-1]})
	}
	if len(recs) > 0 {
		if err := tl.apply(r.ctx, recs); err != nil {
			return err
		}
	}
	finished := make([]int64, 0, len(last))
	for off := range last {
		if _, done := slices.BinarySearch(r.skip, off); !done {
			finished = append(finished, off)
		}
	}
	if len(finished) > 0 {
		slices.Sort(finished)
		r.skip = append(slices.Clone(r.skip), finished...)
		slices.Sort(r.skip)
		r.skip, r.skipAt = slices.Compact(r.skip), 0
	}
	r.tl = tl
	return nil
}

// read calls f for each message of the log in [from, to).
func (tl *txnLog) read(ctx context.Context, from, to int64, f func(*EnhancedMessage)) error {
	buf := make([]*EnhancedMessage, 256)
	for off := from; off < to; {
		n, err := tl.lq.Read(ctx, off, buf[:min(int64(len(buf)), to-off)])
		if err != nil {
			return fmt.Errorf("read transaction log %s at %d: %w", tl.lq.ID(), off, err)
		}
		for _, msg := range buf[:n] {
			if msg.Offset >= to {
				return nil
			}
			f(msg)
			off = msg.Offset + 1
		}
	}
	return nil
}

// loadFloor reads the applied floor, the group's cursor on the log
// queue (taking it, where the store hands cursors over, so that a former
// owner's floor commits are refused from now on); -1 when none.
func (tl *txnLog) loadFloor(ctx context.Context) (int64, error) {
	m := tl.r.m
	offs, err := m.b.cursors.Load(ctx, tl.name, m.scope, len(tl.t.queues))
	if err != nil {
		return 0, err
	}
	m.b.groups.register(tl.name, m.scope, offs) // its release needs to know the group reads it
	if hs, ok := m.b.cursors.(HandoffCursorStore); ok {
		cur, _, err := hs.TakeCursor(ctx, tl.name, m.scope, tl.r.q, tl.token)
		return cur, err
	}
	return offs[tl.r.q], nil
}

// newRecord returns a log message tagged tag with body, stamped with an
// ID of its own as a producer stamps a message: a store may take a
// message ID seen before for a retried write of it (natsstore publishes
// it as Nats-Msg-Id), and a zero ID on every record would make each
// record after the first a duplicate of it.
// The envelope comes from the log's slab, as a producer's do.
func (tl *txnLog) newRecord(tag string, body []byte) *EnhancedMessage {
	now := tl.r.m.b.clock.now()
	em, c := takeEnvelope(&tl.slab)
	em.Topic, em.Tag, em.Body = tl.name, tag, body
	em.ID = messageID(now, c)
	em.BornUnixNano = now.UnixNano()
	return em
}

// commit writes the record of the call that handled input offset off
// and sent outs, then their outputs (in memory; elsewhere the applier
// writes them once the record is in the log, and the input finishes
// without waiting for them), unless the queue is no longer this
// holding's: then the record is the next owner's to apply (see
// takeTxn), and the message goes back unfinished. A write refused
// outright (too large) fails the attempt.
func (tl *txnLog) commit(ctx context.Context, r *queueRun, off int64, outs []txnOutput) error {
	var mp memParts
	if tl.memoryParts(outs, &mp) {
		return tl.commitMemory(ctx, r, off, outs, &mp)
	}
	rec := tl.newRecord(tl.recordTag(off), encodeTxnRecord(outs))
	dec := make([]decodedOutput, len(outs))
	for i, o := range outs {
		dec[i] = decodedOutput{topic: o.t.meta.Name, q: o.q, inc: o.t.meta.Incarnation, at: o.at, em: o.em}
	}
	p, err := tl.write(&txnPending{em: rec, off: off, outs: dec, ctx: ctx, sent: outs})
	if err != nil {
		return tl.notWritten(ctx, r, off, outs, err)
	}
	if p.aerr != nil {
		sent(ctx, outs, &Error{Op: "outbox send", Err: fmt.Errorf("not written by this call: its queue was given up (its next owner writes them): %w", p.aerr)})
		r.m.report(&Error{Op: fmt.Sprintf("write outputs of transaction of %s offset %d: queue given up", r.id, off), Err: p.aerr})
		r.lose()
		return errGivenUp
	}
	if !p.queued {
		sent(ctx, outs, nil)
	}
	return tl.landed(r)
}

// recordTag returns the tag of the record of input offset off.
func (tl *txnLog) recordTag(off int64) string {
	var tag [maxRecordTag]byte // the tag built on the stack: one string
	return string(tl.appendRecordTag(tag[:0], off))
}

// maxRecordTag is the longest a record's tag can be.
const maxRecordTag = len(txnRecordTag) + 2*20 + 1

func (tl *txnLog) appendRecordTag(b []byte, off int64) []byte {
	b = strconv.AppendInt(append(b, txnRecordTag...), off, 10)
	return strconv.AppendUint(append(b, ','), tl.token, 10)
}

// blockTag is recordTag cut from the log's current block of tags (a new
// one when it is full), as a delay level cuts its messages' (see
// delayedMessage): one allocation for the tags of many records. tl.wmu
// must be held.
func (tl *txnLog) blockTag(off int64) string {
	// Written in place: the block's bytes up to len(tl.tags) are never
	// written again.
	if cap(tl.tags)-len(tl.tags) < maxRecordTag {
		tl.tags = make([]byte, 0, tagBlock)
	}
	start := len(tl.tags)
	tl.tags = tl.appendRecordTag(tl.tags, off)
	return unsafe.String(&tl.tags[start], len(tl.tags)-start)
}

// notWritten ends a commit whose record this call did not write (err
// says why): too large, the attempt fails; else the queue is given up,
// the record stored or not being the next owner's to judge.
func (tl *txnLog) notWritten(ctx context.Context, r *queueRun, off int64, outs []txnOutput, err error) error {
	if errors.Is(err, ErrMessageTooLarge) || errors.Is(err, ErrInvalidMessage) {
		err = &Error{Op: fmt.Sprintf("commit transaction of %s offset %d", r.id, off), Err: err}
		sent(ctx, outs, &Error{Op: "outbox send", Err: fmt.Errorf("not stored: %w", err)})
		return err
	}
	sent(ctx, outs, &Error{Op: "outbox send", Err: fmt.Errorf("not written by this call: its queue was given up (its next owner writes them if the transaction's record was stored): %w", err)})
	r.m.report(&Error{Op: fmt.Sprintf("commit transaction of %s offset %d: queue given up", r.id, off), Err: err})
	r.lose()
	return errGivenUp
}

// landed ends a commit whose record is in the log: nil, unless the call
// may no longer finish its input (its queue lost, or past its deadline:
// the next owner finishes it, with the record's outputs).
func (tl *txnLog) landed(r *queueRun) error {
	if !r.h.lands() || r.pastDeadline() {
		return errGivenUp
	}
	return nil
}

// write writes p's record to the log with whatever other records are
// waiting (one write for all: group commit), and has the applier write
// their outputs (one write per target queue for all it has), and returns
// p: its offset, or the error of the record's write (or of the outputs',
// when the applier gave up before). One writer at a time: the others
// wait, and the first waiting writes next. A write that lands after
// records of another writer checks them: one with a later token fences
// this holding out (errTxnFenced), and its records are void. A log in
// memory has each caller write its own record (under wmu) and outputs:
// no one waits for a writer to wake it, and none for an fdatasync.
func (tl *txnLog) write(p *txnPending) (*txnPending, error) {
	if _, ok := tl.lq.(*MemoryQueue); ok {
		one := [1]*txnPending{p}
		tl.wmu.Lock()
		tl.writeBatch(one[:])
		tl.wmu.Unlock()
		if p.err == nil {
			p.aerr = tl.apply(tl.r.hctx, []txnRecord{{at: p.at, outs: p.outs}})
		}
		return p, p.err
	}
	p.wake = make(chan struct{})
	tl.mu.Lock()
	tl.waiting = append(tl.waiting, p)
	if tl.writing {
		tl.mu.Unlock()
		<-p.wake
		if !p.lead {
			return p, p.err
		}
		tl.mu.Lock()
	}
	tl.writing = true
	batch := tl.waiting
	tl.waiting = nil
	tl.mu.Unlock()

	tl.writeBatch(batch)
	if p.err == nil { // the batch's records are in the log: the applier writes their outputs
		tl.enqueue(batch)
	}
	tl.mu.Lock()
	if len(tl.waiting) > 0 {
		next := tl.waiting[0]
		next.lead = true
		close(next.wake)
	} else {
		tl.writing = false
	}
	tl.mu.Unlock()
	for _, q := range batch {
		if q != p && !q.lead {
			close(q.wake)
		}
	}
	return p, p.err
}

// writeBatch writes batch's records with one Write and sets each one's
// offset or error; the writer's.
func (tl *txnLog) writeBatch(batch []*txnPending) {
	r := tl.r
	fail := func(err error) {
		for _, p := range batch {
			p.err = err
		}
	}
	tl.mu.Lock()
	fenced := tl.fenced
	tl.mu.Unlock()
	if fenced {
		fail(errTxnFenced)
		return
	}
	msgs := make([]*EnhancedMessage, len(batch))
	for i, p := range batch {
		msgs[i] = p.em
	}
	first, err := tl.lq.Write(r.hctx, msgs)
	if err != nil {
		fail(err)
		return
	}
	if first != tl.next {
		if fenced, err := tl.fencedIn(tl.next, first); err != nil || fenced {
			if err == nil {
				err = errTxnFenced
				tl.mu.Lock()
				tl.fenced = true
				tl.mu.Unlock()
			}
			fail(err)
			return
		}
	}
	tl.mu.Lock()
	for i, p := range batch {
		p.at = first + int64(i)
		tl.applied = append(tl.applied, txnApplied{at: p.at, off: p.off})
	}
	tl.next = first + int64(len(batch))
	tl.last = tl.next - 1
	tl.mu.Unlock()
}

// fencedIn reports whether the log's records in [from, to), another
// writer's, hold a later token than this holding's.
func (tl *txnLog) fencedIn(from, to int64) (bool, error) {
	fenced := false
	err := tl.read(tl.r.hctx, from, to, func(msg *EnhancedMessage) {
		if _, _, token, err := parseTxnTag(msg.Tag); err == nil && token > tl.token {
			fenced = true
		}
	})
	return fenced, err
}

// commitFloor commits the applied floor for the queue's cursor c, just
// committed: the oldest record applied by this holding whose input is
// at or above c, or this holding's last record (its marker at first),
// so that the next owner's take reads every record it may need and
// this holding's token first. The log is released below it.
func (tl *txnLog) commitFloor(ctx context.Context, c int64, now bool) error {
	tl.mu.Lock()
	if !now && time.Since(tl.floorAt) < floorEvery {
		tl.mu.Unlock()
		return nil // a floor left lower only has the next owner read more of the log
	}
	floor := tl.last
	if len(tl.pend) > 0 {
		floor = min(floor, tl.pend[0].at) // outputs not written yet
	}
	kept := tl.applied[:0]
	for _, a := range tl.applied {
		if a.off >= c {
			kept = append(kept, a)
			floor = min(floor, a.at)
		}
	}
	clear(tl.applied[len(kept):])
	tl.applied = kept
	if floor <= tl.committed {
		tl.mu.Unlock()
		return nil
	}
	tl.mu.Unlock()
	m := tl.r.m
	var err error
	if fs, ok := m.b.cursors.(FencedCursorStore); ok {
		err = fs.CommitFenced(ctx, tl.name, m.scope, tl.r.q, floor, tl.token)
	} else {
		err = m.b.cursors.Commit(ctx, tl.name, m.scope, tl.r.q, floor)
	}
	if err != nil {
		if errors.Is(err, ErrFenced) {
			tl.r.lose()
		}
		return &Error{Op: fmt.Sprintf("commit transaction log %s at %d", tl.lq.ID(), floor), Err: err}
	}
	tl.mu.Lock()
	tl.committed = max(tl.committed, floor)
	tl.floorAt = time.Now()
	tl.mu.Unlock()
	if rel, ok := tl.lq.(Releaser); ok {
		low, err := m.b.groups.releaseTo(ctx, tl.t, m.scope, tl.r.q, floor)
		if err != nil {
			return &Error{Op: fmt.Sprintf("release transaction log %s", tl.lq.ID()), Err: err}
		}
		rel.Release(low)
	}
	return nil
}

// forget drops what the holding applied: a seek asks for the messages
// as they are, handled or not.
func (tl *txnLog) forget() {
	tl.mu.Lock()
	tl.applied = nil
	tl.mu.Unlock()
}
