package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Committing: a held queue's cursor is loaded when the queue is taken
// and committed as messages finish (the smallest unfinished offset),
// fenced by the lease's token where the store can.

// commitCursor commits off for r's queue, with finished (the finished
// set above it, see HandoffCursorStore) when the store keeps one, fenced by
// the lease's token when the store can; ErrFenced loses the queue. now
// says that a transaction log's floor must follow at once (a take, a
// seek, the last commit), not at most every floorEvery.
func (r *queueRun) commitCursor(ctx context.Context, off int64, finished []int64, now bool) error {
	m := r.m
	var err error
	if r.cslot != nil {
		err = r.cslot.commit(off, r.lease.Token(), finished)
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
	} else if fs, ok := m.b.cursors.(HandoffCursorStore); ok && len(finished) > 0 {
		err = fs.CommitFinished(ctx, m.topic, m.scope, r.q, off, finished, r.lease.Token())
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
	} else if fs, ok := m.b.cursors.(FencedCursorStore); ok {
		err = fs.CommitFenced(ctx, m.topic, m.scope, r.q, off, r.lease.Token())
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
	} else {
		err = m.b.cursors.Commit(ctx, m.topic, m.scope, r.q, off)
	}
	if err == nil && r.tl != nil {
		err = r.tl.commitFloor(ctx, off, now)
	}
	return err
}

// load reads the committed cursor, picks the start offset (WithStartFrom
// without a cursor, a reset outside the retained range) and commits it.
func (r *queueRun) load() (int64, error) {
	m := r.m
	offs, err := m.b.cursors.Load(r.ctx, m.topic, m.scope, len(r.t.queues))
	if err != nil {
		return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
	}
	if _, listed := m.b.cursors.(CursorGroups); !listed || r.t.meta.Retention.Overflow == Block {
		// Block queues' releases, and ForgetGroup over a store that
		// cannot list its groups, need to know the group reads the topic.
		m.b.groups.register(m.topic, m.scope, offs)
	}
	if ms, ok := m.b.cursors.(*MemoryCursorStore); ok {
		r.cslot = ms.slot(m.topic, m.scope, r.q)
	}
	cur := offs[r.q]
	var set []int64
	if hs, ok := m.b.cursors.(HandoffCursorStore); ok {
		// The take fences the previous owner out before it reads: its
		// late commits are refused from now on.
		cur, set, err = hs.TakeCursor(r.ctx, m.topic, m.scope, r.q, r.lease.Token())
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
		if err != nil {
			return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
		}
	}
	oldest, next, err := queueOffsets(r.ctx, r.queue)
	if err != nil {
		return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
	}
	start := cur
	switch {
	case cur < 0 && m.cfg.startFrom == Latest:
		start = next
	case cur < 0:
		start = oldest
	case cur < oldest || cur > next:
		start = r.resetTo(cur, oldest, next)
	}
	if start == cur && len(set) > 0 {
		if err := ValidateFinishedSet(start, set); err != nil {
			// Skipping a message that did not finish would lose it: a set
			// that breaks the rules is not trusted at all.
			m.report(&Error{Op: fmt.Sprintf("take %s: finished set of %T ignored", r.id, m.b.cursors), Err: err})
		} else {
			r.skip, r.skipAt = set, 0
		}
	}
	if m.cfg.transactional {
		if err := r.takeTxn(start); err != nil {
			return 0, &Error{Op: fmt.Sprintf("take %s: transaction log", r.id), Err: err}
		}
	}
	if start != cur {
		began := time.Now()
		err := r.commitCursor(r.ctx, start, nil, true)
		m.recordCommit(time.Since(began))
		if err != nil {
			return 0, &Error{Op: fmt.Sprintf("take %s", r.id), Err: err}
		}
	}
	r.commitMu.Lock()
	r.committed = start
	r.commitMu.Unlock()
	r.releaseBlocked(start)
	return start, nil
}

// finishedSet returns the finished set to commit with the cursor at off
// for the last time: what this holding finished above off, and what the
// previous owner had (see load) that is still above off; nil when the
// store keeps no set.
func (r *queueRun) finishedSet(off int64) []int64 {
	if _, ok := r.m.b.cursors.(HandoffCursorStore); !ok {
		return nil
	}
	own := r.buf.finishedAbove(nil, MaxFinishedSet)
	var carried []int64
	for _, o := range r.skip {
		if o > off {
			carried = append(carried, o)
		}
	}
	if len(carried) == 0 {
		return own
	}
	set := append(own, carried...)
	slices.Sort(set)
	set = slices.Compact(set)
	if len(set) > MaxFinishedSet {
		set = set[:MaxFinishedSet]
	}
	return set
}

// resetTo returns where a consumer at offset from, outside the retained
// range [oldest, next], goes on, and reports the reset.
func (r *queueRun) resetTo(from, oldest, next int64) int64 {
	to := oldest
	if from > next {
		to = next
	}
	m := r.m
	m.b.log.Warn("ferry: cursor reset", "group", m.scope, "queue", r.id.String(), "from", from, "to", to)
	if m.cfg.onReset != nil {
		m.cfg.onReset(r.id, from, to)
	}
	m.hooks.onReset(m.scope, r.id, from, to)
	return to
}

// commit stores the buffer's committable offset if it moved. final marks
// the run released: no commit from it follows, so a slow committer cannot
// move the cursor back after the next owner took the queue.
func (r *queueRun) commit(final bool) error {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	return r.commitLocked(final)
}

// tryCommit is commit(false) unless another goroutine is committing r
// (false): that one, or the committer, commits what is finished. A commit
// that failed is false too: the committer tries it again, and reports it.
func (r *queueRun) tryCommit() bool {
	if !r.commitMu.TryLock() {
		return false
	}
	defer r.commitMu.Unlock()
	return r.commitLocked(false) == nil
}

// commitLocked is commit; r.commitMu is held.
func (r *queueRun) commitLocked(final bool) error {
	// The gate: commits land until the holding is released (the holding's
	// goroutine publishes released before its last commit, which takes
	// the lock after every commit that passed this), never once the
	// lease is lost.
	if final && r.h.posted(evLost) || !final && !r.h.lands() || r.expired() {
		return nil
	}
	off := r.buf.Committable()
	var finished []int64
	if final {
		finished = r.finishedSet(off)
	}
	if off == r.committed && len(finished) == 0 {
		return nil
	}
	m := r.m
	start := time.Now()
	err := r.commitCursor(context.Background(), off, finished, final)
	took := time.Since(start)
	m.recordCommit(took)
	if m.hooks != nil {
		m.hooks.onCommitted(CommitEvent{Group: m.scope, Member: m.cfg.memberID, Queue: r.id, Offset: off, Took: took, Err: err})
	}
	if err != nil {
		return &Error{Op: fmt.Sprintf("commit %s at %d", r.id, off), Err: err}
	}
	r.committed = off
	m.lastCommit.Store(start.Add(took).UnixNano())
	r.releaseBlocked(off)
	return nil
}

// commitFloor commits r's transaction log's floor for the cursor last
// committed, unless the holding's commits no longer land (see
// commitLocked).
func (r *queueRun) commitFloor() {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	if !r.h.lands() || r.expired() {
		return
	}
	if err := r.tl.commitFloor(context.Background(), r.committed, true); err != nil {
		r.m.report(err)
	}
}

// releaseBlocked lets a Block queue drop what every group is done with.
func (r *queueRun) releaseBlocked(off int64) {
	m := r.m
	if r.t.meta.Retention.Overflow != Block {
		return
	}
	rel, ok := r.queue.(Releaser)
	if !ok {
		return
	}
	low, err := m.b.groups.releaseTo(context.Background(), r.t, m.scope, r.q, off)
	if err != nil {
		m.report(&Error{Op: fmt.Sprintf("release %s", r.id), Err: err})
		return
	}
	rel.Release(low)
}

// fastCursors reports whether the cursor store commits in about a
// microsecond: this package's memory store, or one measured so.
func (m *groupMember) fastCursors() bool {
	if _, ok := m.b.cursors.(*MemoryCursorStore); ok {
		return true
	}
	return m.b.groups.commitCost.Load() <= int64(inlineCommitMax)
}

// inlineCommitMax is the longest a cursor commit may take, on average, for
// workers to commit in place rather than wake the committer goroutine.
const inlineCommitMax = 20 * time.Microsecond

// finished is called once messages of r are marked done: it commits r's
// cursor in the caller's goroutine when the cursor store has been fast
// (a memory store: a wake-up of the committer costs more than the
// commit) and no one else is committing r, and wakes the committer
// otherwise (a store on disk, say, whose commits must not hold up the
// handlers).
func (m *groupMember) finished(r *queueRun) {
	if m.fastCursors() && r.tryCommit() {
		return
	}
	m.markDirty()
}

// recordCommit folds the duration of a cursor commit into commitCost.
func (m *groupMember) recordCommit(d time.Duration) {
	c := &m.b.groups.commitCost
	old := c.Load()
	c.Store(old + (int64(d)-old)/2)
}

// markDirty wakes the committer, starting it the first time.
func (m *groupMember) markDirty() {
	select {
	case m.dirty <- struct{}{}:
	default:
	}
	if !m.committing.Load() {
		m.mu.Lock()
		if !m.committing.Load() && !m.halted && m.state == memberStarted {
			m.committing.Store(true)
			m.wg.Add(1) // before halted is set, the membership loop holds the count above zero
			go m.committer()
		}
		m.mu.Unlock()
	}
}

// retire ends an idle committer, unless a markDirty came meanwhile that
// saw it running (then it goes on: true). markDirty marks dirty and then
// reads committing; retire clears committing and then reads dirty, so one
// of the two sees the other.
func (m *groupMember) retire() bool {
	m.committing.Store(false)
	select {
	case <-m.dirty:
	default:
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.committing.Load() || m.halted {
		select { // another committer took over, or none is needed
		case m.dirty <- struct{}{}:
		default:
		}
		return false
	}
	m.committing.Store(true)
	return true
}

// Backoff of the committer's tries after a failed commit.
const (
	commitRetryBase = 20 * time.Millisecond
	commitRetryMax  = 2 * time.Second
)

// committer commits the cursors of owned queues whenever they may have
// moved, until every queue is released or it has been idle for
// workerIdle (the next markDirty starts it again). After a commit
// failed it tries again with backoff, finishes or not (they do not hurry
// it), and does not retire until one succeeds.
func (m *groupMember) committer() {
	defer m.wg.Done()
	var runs []*queueRun
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	again := time.NewTimer(time.Hour)
	again.Stop()
	defer again.Stop()
	failures := 0
	for {
		select {
		case <-m.dirty:
			idle.Reset(workerIdle)
			if failures > 0 {
				continue // the backoff's timer tries again
			}
		case <-again.C:
		case <-m.halt:
			return // every run committed its last offset on release
		case <-idle.C:
			if failures == 0 && !m.retire() {
				return
			}
			idle.Reset(workerIdle)
		}
		m.mu.Lock()
		runs = runs[:0]
		for _, r := range m.runs {
			runs = append(runs, r)
		}
		m.mu.Unlock()
		failed := false
		for _, r := range runs {
			if err := r.commit(false); err != nil {
				m.report(err)
				failed = true
			}
		}
		clear(runs)
		if !failed {
			failures = 0
			continue
		}
		failures++
		again.Reset(backoff(commitRetryBase, commitRetryMax, failures))
	}
}
