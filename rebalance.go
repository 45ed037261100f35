package ferry

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Rebalancing: the membership loop recomputes the member's share of the
// group's queues after every change (allocate), releases the queues it
// loses and takes the new ones (rebalance).

// startLoop starts following sess, the caller kicks the loop; the
// member's WaitGroup counts the loop until it ends.
func (m *groupMember) startLoop(sess Session) {
	m.wg.Add(1)
	m.sess = sess
	m.first = true
	m.changed.Store(true) // the join changed the membership
	m.watch(sess)
	m.kicks.Store(0) // what kicked before is pending: the loop sees it; the caller kicks
}

// kick wakes the membership loop, starting its goroutine if it has none.
// It neither blocks nor calls the coordinator (see sessionNotifier).
func (m *groupMember) kick() {
	if m.kicks.Add(1) == 1 {
		go m.loop()
	}
}

// sessionEvent is a membership change, or the session's end.
func (m *groupMember) sessionEvent() {
	m.changed.Store(true)
	m.kick()
}

// watch makes sess's events kick the loop: through the session itself
// when it can (this package's coordinator), through a goroutine watching
// Changed and Done otherwise.
func (m *groupMember) watch(sess Session) {
	if n, ok := sess.(sessionNotifier); ok {
		if !n.notify(m.sessionEvent) {
			m.kick() // ended already: the loop sees Done
		}
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			select {
			case <-sess.Changed():
				m.sessionEvent()
			case <-sess.Done():
				m.kick()
				return
			case <-m.stop:
				return
			}
		}
	}()
}

// loop runs the membership loop until nothing is pending and no kick
// came since it last looked, or until it ends.
func (m *groupMember) loop() {
	for {
		n := m.kicks.Load()
		if m.step() {
			m.kicks.Store(noKick)
			m.endLoop()
			return
		}
		if m.kicks.CompareAndSwap(n, 0) {
			return
		}
	}
}

// loopFirst is the loop's first turn, run by Start: one step; the rest,
// if there is more, in a goroutine.
func (m *groupMember) loopFirst() {
	n := m.kicks.Load()
	if m.step() {
		m.kicks.Store(noKick)
		go m.endLoop()
		return
	}
	if !m.kicks.CompareAndSwap(n, 0) {
		go m.loop()
	}
}

// settle records the runs of the first assignment, for Start.
func (m *groupMember) settle(runs []*queueRun) {
	if m.first {
		m.mu.Lock()
		m.firstRuns = runs
		m.mu.Unlock()
		close(m.assignedFirst)
		m.first = false
	}
}

// step handles what is pending; true when the member stops.
func (m *groupMember) step() bool {
	for {
		select {
		case <-m.stop:
			return true
		case <-m.sess.Done():
			m.report(&Error{Op: fmt.Sprintf("group %s member %q", m.key, m.cfg.memberID), Err: fmt.Errorf("%w: joining again", ErrSessionExpired)})
			m.rebalance(nil, nil) // the runs stopped when their leases were lost
			if m.sess = m.rejoin(); m.sess == nil {
				return true
			}
			m.changed.Store(true)
			m.watch(m.sess)
		default:
			switch {
			case m.retopic.Swap(false):
				m.refreshView()
				mine, _ := m.allocate(m.sess.Members())
				m.rebalance(mine, m.sess)
				continue
			case m.rerun.Swap(false):
				m.dropEnded()
				mine, _ := m.allocate(m.sess.Members())
				m.rebalance(mine, m.sess)
				continue
			case !m.changed.Swap(false):
				return false
			}
			mine, ok := m.allocate(m.sess.Members())
			runs := m.rebalance(mine, m.sess)
			if !ok {
				runs = nil // a broken split: Start does not wait for locks that may never come
			}
			m.settle(runs)
			if m.onChanged != nil {
				m.onChanged()
			}
		}
	}
}

// endLoop releases every queue, leaves the group and stops the workers.
func (m *groupMember) endLoop() {
	defer m.wg.Done()
	m.rebalance(nil, nil)
	if m.sess != nil {
		m.leave(m.sess)
	}
	m.settle(nil)
	m.sched.halt() // no worker starts from now on
	m.mu.Lock()
	m.halted = true // no committer starts either
	m.mu.Unlock()
	close(m.halt)
	m.markDirty()
}

// relockBackoff is the pause before a member takes a queue again whose
// lock failed (other than by expiry or release).
const relockBackoff = 200 * time.Millisecond

// runEnded is called as a run ends: if no rebalance revoked it (its lease
// was lost, its lock failed) and the member goes on, the loop takes the
// queue again if it is still the member's.
func (m *groupMember) runEnded(r *queueRun) {
	if r.h.posted(evRevoke) || m.closing() {
		return
	}
	m.rerun.Store(true)
	m.kick()
}

// dropEnded forgets the runs that ended without a rebalance revoking
// them, so that the next rebalance starts new ones for their queues.
func (m *groupMember) dropEnded() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for q, r := range m.runs {
		select {
		case <-r.done:
			if !r.h.posted(evRevoke) {
				delete(m.runs, q)
			}
		default:
		}
	}
}

// topicView is a topic's state and its queue IDs, as a member sees it.
type topicView struct {
	t   *topicState
	ids []QueueID
}

// newTopicView returns the view of t.
func newTopicView(t *topicState) *topicView {
	ids := make([]QueueID, len(t.queues))
	for i := range ids {
		ids[i] = QueueID{Topic: t.meta.Name, Queue: i}
	}
	return &topicView{t: t, ids: ids}
}

// refreshView takes the topic's state anew (it gained queues).
func (m *groupMember) refreshView() {
	if t, err := m.b.topic(m.topic); err == nil {
		m.view.Store(newTopicView(t))
	}
}

// topicGrew tells the member that its topic gained queues.
func (m *groupMember) topicGrew() {
	m.retopic.Store(true)
	m.kick()
}

// rejoinBackoff bounds the wait between two tries to join again.
const rejoinBackoff = time.Second

// rejoin joins the group again after the session expired, trying until it
// works or close begins (nil).
func (m *groupMember) rejoin() Session {
	wait := 10 * time.Millisecond
	for {
		sess, err := m.coord.Join(m.life, m.key, m.cfg.memberID)
		if err == nil {
			return sess
		}
		if m.closing() {
			return nil
		}
		m.report(&Error{Op: fmt.Sprintf("join group %s again", m.key), Err: err})
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-m.stop:
			t.Stop()
			return nil
		}
		wait = min(2*wait, rejoinBackoff)
	}
}

// allocate returns the queues this member should own now. ok is false when
// the split is broken (reported).
func (m *groupMember) allocate(members []string) (mine []QueueID, ok bool) {
	ids := m.view.Load().ids
	if m.cfg.broadcast {
		return ids, true
	}
	if !slices.Contains(members, m.cfg.memberID) {
		return nil, true // left: own nothing
	}
	a := m.cfg.allocator
	owners := make([]int, len(ids))
	var bad []string
	for _, member := range members {
		got, err := safeAllocate(a, m.group, member, ids, members)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		seen := map[int]bool{}
		for _, q := range got {
			if q.Topic != m.topic || q.Queue < 0 || q.Queue >= len(ids) {
				bad = append(bad, fmt.Sprintf("gave member %q unknown queue %s", member, q))
				continue
			}
			if seen[q.Queue] {
				continue
			}
			seen[q.Queue] = true
			owners[q.Queue]++
			if member == m.cfg.memberID {
				mine = append(mine, q)
			}
		}
	}
	for i, n := range owners {
		switch {
		case n == 0:
			bad = append(bad, fmt.Sprintf("left queue %s unowned", ids[i]))
		case n > 1:
			bad = append(bad, fmt.Sprintf("gave queue %s to %d members", ids[i], n))
		}
	}
	slices.SortFunc(mine, QueueID.Compare)
	if len(bad) == 0 {
		m.mu.Lock()
		m.lastErr = ""
		m.mu.Unlock()
		return mine, true
	}
	more := ""
	if len(bad) > 1 {
		more = fmt.Sprintf(" (and %d more problems)", len(bad)-1)
	}
	err := &Error{Op: fmt.Sprintf("group %q", m.group), Err: fmt.Errorf("%w: allocator %T over %d members: %s%s", ErrInvalidAllocation, a, len(members), bad[0], more)}
	m.mu.Lock()
	repeat := m.lastErr == err.Error()
	m.lastErr = err.Error()
	m.mu.Unlock()
	if !repeat {
		m.report(err)
	}
	return mine, false
}

func safeAllocate(a Allocator, group, self string, queues []QueueID, members []string) (got []QueueID, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked for member %q: %v", self, r)
		}
	}()
	return a.Allocate(group, self, slices.Clone(queues), slices.Clone(members)), nil
}

// rebalance releases the owned queues not in mine (all of them in
// parallel, each waiting for its drain) and then, with a session, starts
// runs for the queues of mine not owned, which lock them in sess. It
// returns the runs it started.
func (m *groupMember) rebalance(mine []QueueID, sess Session) []*queueRun {
	m.b.urgent.Add(1)
	defer m.b.urgent.Add(-1)
	want := func(q int) bool { return slices.ContainsFunc(mine, func(id QueueID) bool { return id.Queue == q }) }
	m.mu.Lock()
	var lost []*queueRun
	for q, r := range m.runs {
		if !want(q) {
			lost = append(lost, r)
		}
	}
	m.mu.Unlock()
	for _, r := range lost {
		r.revoke() // the run drains, commits and unlocks
	}
	for _, r := range lost {
		<-r.done
	}
	m.mu.Lock()
	for _, r := range lost {
		delete(m.runs, r.q)
	}
	var started []*queueRun
	if sess != nil {
		for _, q := range mine {
			if _, ok := m.runs[q.Queue]; ok {
				continue
			}
			r := m.newRun(q.Queue, sess)
			r.h.hold(holdPause, m.pausedLocked(q.Queue))
			m.runs[q.Queue] = r
			started = append(started, r)
			m.wg.Add(1)
		}
	}
	m.mu.Unlock()
	for _, r := range started {
		m.startRun(r)
	}
	if (len(lost) > 0 || len(started) > 0) && m.b.log.Enabled(context.Background(), slog.LevelInfo) {
		m.b.log.Info("ferry: rebalance", "group", m.group, "topic", m.topic, "member", m.cfg.memberID,
			"released", len(lost), "taking", len(started), "queues", mine)
	}
	return started
}

// startRun takes r's queue: in the caller's goroutine when its lock is
// free and taking it is quick (the session can tell at once, the cursor
// store is fast, and no WithOnAssigned callback is to run in the queue's
// goroutine); in a goroutine of its own otherwise.
func (m *groupMember) startRun(r *queueRun) {
	if lt, ok := r.sess.(lockTrier); ok && m.cfg.onAssigned == nil && m.fastCursors() {
		if lease := lt.tryLock(r.q); lease != nil {
			r.taken(lease)
			return
		}
	}
	go r.run()
}
