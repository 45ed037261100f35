package ferry

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// groupMember is what push and pull consumers share: it joins the group
// through the broker's coordinator, follows rebalances, runs one fetch
// loop per owned queue into that queue's Buffer, schedules buffers with
// pending messages for whoever takes them, and commits cursors.
type groupMember struct {
	b     *Broker
	cfg   *consumerConfig
	group string
	topic string
	scope string // cursor group: group, or group@member for broadcast
	key   GroupKey
	coord Coordinator
	tags  map[string]struct{}

	// view is the topic as the member last saw it (its queues grow with
	// Broker.AddQueues); retopic is set when it changed.
	view    atomic.Pointer[topicView]
	retopic atomic.Bool
	rerun   atomic.Bool // a run ended on its own (its lease lost, its lock failed): take its queue again
	sched   scheduler
	dirty   chan struct{} // something may be committable
	// committing is set once the committer runs: it starts with the
	// first markDirty (an idle consumer keeps no committer), unless the
	// member halted (halted, under mu).
	committing atomic.Bool
	halted     bool
	// life ends when close begins (stop is its Done): everything is
	// released; it bounds the coordinator calls made on the member's
	// behalf.
	life    context.Context
	endLife context.CancelFunc
	stop    <-chan struct{}
	halt    chan struct{} // closed once every queue is released: workers stop
	wg      sync.WaitGroup
	// lastCommit is when a cursor was last committed (Unix ns), and
	// handled counts the messages a pull consumer finished: for Stats.
	lastCommit atomic.Int64
	handled    atomic.Uint64
	hooks      *hookSet // the broker's and the consumer's; nil: none

	// assignedFirst is closed by the loop once the first rebalance has
	// started the runs of the first assignment (firstRuns), or when the
	// loop stops before one: Start waits on it, and on those runs' ready.
	assignedFirst chan struct{}

	mu        sync.Mutex // guards runs, state, lastErr, firstRuns and closeErrs
	runs      map[int]*queueRun
	state     int // memberNew, memberStarted, memberClosed
	lastErr   string
	firstRuns []*queueRun
	closeErrs []error      // what failed while closing: Close returns it
	pauseAll  bool         // every queue is paused, those assigned later too
	paused    map[int]bool // queues paused one by one

	startMu   sync.Mutex // serializes start: one Join at a time
	closeOnce sync.Once
	closeErr  error
	pull      bool // a PullConsumer's: Close does not wait for polled messages
	// dropRetries, set by a push consumer before it starts, abandons the
	// retries waiting for a queue being released.
	dropRetries func(r *queueRun)
	// onChanged, when set, runs in the membership loop after each
	// membership change (the consumer starts reading its retry topic
	// once it exists).
	onChanged func()
	// closeOwner, when set, closes what runs the member: its Consumer,
	// with the retry reader it runs beside it. The broker closes a
	// member it ends for its own reasons (a forced DeleteTopic) through
	// it, so that no member of the consumer outlives it.
	closeOwner func() error
	// pausedBy, set for a retry reader, says whether its queue q is
	// paused: its own Pause state is its consumer's (see
	// pausesRetryQueue). It takes the consumer's member's lock under this
	// member's, never the other way round.
	pausedBy func(q int) bool

	// The membership loop's state (see startLoop).
	kicks   atomic.Int64
	changed atomic.Bool // the membership changed since the loop last looked
	sess    Session     // the loop's
	first   bool        // the loop's: the first assignment is to come
}

// closing reports whether close has begun.
func (m *groupMember) closing() bool {
	select {
	case <-m.stop:
		return true
	default:
		return false
	}
}

const (
	memberNew = iota
	memberStarted
	memberClosed
)

func newGroupMember(b *Broker, group, topic string, cfg *consumerConfig) *groupMember {
	m := &groupMember{
		b: b, cfg: cfg, group: group, topic: topic, scope: group,
		coord: b.groups.coord,
		dirty: make(chan struct{}, 1),
		halt:  make(chan struct{}),
		runs:  map[int]*queueRun{},

		assignedFirst: make(chan struct{}),
	}
	m.hooks = newHookSet(b.hooks, cfg.hooks)
	m.life, m.endLife = context.WithCancel(context.Background())
	m.stop = m.life.Done()
	if cfg.broadcast {
		m.scope = group + "@" + cfg.memberID
	}
	m.key = GroupKey{Scope: m.scope, Topic: topic}
	if len(cfg.tags) > 0 {
		m.tags = map[string]struct{}{}
		for _, t := range cfg.tags {
			m.tags[t] = struct{}{}
		}
	}
	m.sched.init()
	m.kicks.Store(noKick) // until startLoop
	return m
}

// start joins the group, starting the goroutines (spawn adds the
// caller's), unless it has already, and waits until the first assignment
// is taken, the member closes ([ErrClosed]) or ctx is done (ctx's error).
// ctx bounds the call only: the member runs until close.
func (m *groupMember) start(ctx context.Context, spawn func()) error {
	m.startMu.Lock()
	m.mu.Lock()
	state := m.state
	m.mu.Unlock()
	switch state {
	case memberClosed:
		m.startMu.Unlock()
		return ErrClosed
	case memberNew:
		if err := m.join(ctx, spawn); err != nil {
			m.startMu.Unlock()
			return err
		}
	}
	m.startMu.Unlock()
	return m.waitSettled(ctx)
}

// join joins the group and starts the goroutines; m.startMu is held. A
// failed join leaves the member new, to be started again.
func (m *groupMember) join(ctx context.Context, spawn func()) error {
	t, err := m.b.topic(m.topic)
	if err != nil {
		return err
	}
	view := newTopicView(t)
	if err := m.b.groups.add(m); err != nil {
		return err
	}
	var sess Session
	if _, ok := m.coord.(*MemoryCoordinator); ok {
		sess, err = m.coord.Join(ctx, m.key, m.cfg.memberID) // it does not wait
	} else {
		// The Join ends with ctx or with close.
		jctx, cancel := context.WithCancel(ctx)
		stopJoin := context.AfterFunc(m.life, cancel)
		sess, err = m.coord.Join(jctx, m.key, m.cfg.memberID)
		stopJoin()
		cancel()
	}
	if err != nil {
		m.b.groups.remove(m)
		if m.closing() {
			return ErrClosed
		}
		return err
	}
	m.mu.Lock()
	if m.state == memberClosed {
		m.mu.Unlock()
		m.b.groups.remove(m)
		m.leave(sess)
		return ErrClosed
	}
	m.view.Store(view)
	m.state = memberStarted
	if spawn != nil {
		spawn() // before the loop, which may release queues at once
	}
	m.startLoop(sess)
	m.mu.Unlock()
	// The loop's first turn (the first assignment) runs here: Start waits
	// for it anyway.
	if m.kicks.Add(1) == 1 {
		m.loop()
	}
	return nil
}

// leaveTimeout bounds the Leave of a closing member.
const leaveTimeout = 10 * time.Second

// leave ends sess, reporting a failure (Close returns it).
func (m *groupMember) leave(sess Session) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := sess.Leave(ctx); err != nil {
		err = &Error{Op: fmt.Sprintf("leave group %s", m.key), Err: err}
		m.report(err)
		m.closeFailed(err)
	}
}

// waitSettled waits until the member holds the queues of its first
// assignment, it is closing ([ErrClosed]) or ctx is done.
func (m *groupMember) waitSettled(ctx context.Context) error {
	select {
	case <-m.assignedFirst:
	case <-m.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	m.mu.Lock()
	runs := m.firstRuns
	m.mu.Unlock()
	for _, r := range runs {
		select {
		case <-r.ready:
		case <-m.stop:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// closeAll closes the member with everything its owner runs (see
// closeOwner): a push consumer's retry reader ends with it.
func (m *groupMember) closeAll() error {
	if m.closeOwner != nil {
		return m.closeOwner()
	}
	return m.close()
}

// close releases every queue (draining, committing and unlocking each),
// leaves the group, stops the goroutines and waits for them. It returns
// what failed meanwhile (a final commit, the leave), the same on every
// call.
func (m *groupMember) close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		started := m.state == memberStarted
		m.state = memberClosed
		m.mu.Unlock()
		m.endLife()
		m.kick() // the membership loop sees stop, and ends
		if !started {
			return
		}
		m.wg.Wait()
		m.b.groups.remove(m)
		if m.cfg.broadcast && m.cfg.generatedID {
			// Nobody can come back under this member's cursor: it must
			// not hold back Block queues for good.
			if err := m.b.groups.forget(context.Background(), m.view.Load().t, m.scope); err != nil {
				m.report(&Error{Op: fmt.Sprintf("forget broadcast member %s", m.scope), Err: err})
			}
		}
		m.mu.Lock()
		m.closeErr = joinErrors(m.closeErrs...)
		m.mu.Unlock()
	})
	return m.closeErr
}

// pause pauses (or, with p false, resumes) the queues of ids, or every
// queue (those assigned later too) when ids is empty. A queue of another
// topic or out of range is ErrInvalidOption, and nothing changes.
func (m *groupMember) pause(p bool, ids []QueueID) error {
	for _, id := range ids {
		if v := m.view.Load(); id.Topic != m.topic || id.Queue < 0 || (v != nil && id.Queue >= len(v.ids)) {
			return fmt.Errorf("%w: queue %s is not one of topic %q", ErrInvalidOption, id, m.topic)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(ids) == 0 {
		m.pauseAll = p
		clear(m.paused)
	} else {
		if m.paused == nil {
			m.paused = map[int]bool{}
		}
		for _, id := range ids {
			m.paused[id.Queue] = p
		}
	}
	for q, r := range m.runs {
		r.setPaused(m.pausedLocked(q))
	}
	return nil
}

// pausedLocked reports whether queue q is to be paused. m.mu held.
func (m *groupMember) pausedLocked(q int) bool {
	if m.pausedBy != nil {
		return m.pausedBy(q)
	}
	if p, ok := m.paused[q]; ok {
		return p
	}
	return m.pauseAll
}

// repause sets each held queue's pause as pausedLocked says.
func (m *groupMember) repause() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for q, r := range m.runs {
		r.setPaused(m.pausedLocked(q))
	}
}

// pausesRetryQueue reports whether queue q of a retry topic of n queues
// is to be paused: while any of m's queues whose retries it holds (o with
// o mod n = q: a topic grown by AddQueues keeps its retry topic's count)
// is paused, so that pausing a queue pauses every retry of it, at the
// cost of also holding back the retries it shares a retry queue with.
func (m *groupMember) pausesRetryQueue(q, n int) bool {
	if n <= 0 {
		return false
	}
	queues := n
	if v := m.view.Load(); v != nil {
		queues = max(len(v.ids), n)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for o := q; o < queues; o += n {
		if m.pausedLocked(o) {
			return true
		}
	}
	return false
}

// pausedQueues returns the queues held and paused, sorted.
func (m *groupMember) pausedQueues() []QueueID {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []QueueID
	for _, r := range m.runs {
		if r.owned.Load() && r.paused.Load() {
			out = append(out, r.id)
		}
	}
	slices.SortFunc(out, QueueID.Compare)
	return out
}

// assigned returns the queues whose lock the member holds, sorted.
func (m *groupMember) assigned() []QueueID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]QueueID, 0, len(m.runs))
	for _, r := range m.runs {
		if r.owned.Load() {
			out = append(out, r.id)
		}
	}
	slices.SortFunc(out, QueueID.Compare)
	return out
}

// report logs err and hands it to the WithOnError function.
func (m *groupMember) report(err error) {
	m.b.log.Error("ferry: consumer", "group", m.group, "member", m.cfg.memberID, "err", err)
	if m.cfg.onError != nil {
		m.cfg.onError(err)
	}
}

// closeFailed records err, a failure of closing (a final commit), for
// Close to return; the same failure twice is kept once.
func (m *groupMember) closeFailed(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.ContainsFunc(m.closeErrs, func(e error) bool { return e.Error() == err.Error() }) {
		m.closeErrs = append(m.closeErrs, err)
	}
}

// The membership loop follows the group until stop, then releases every
// queue, leaves the group and stops the workers; when the session expires
// (every lease is lost with it), it joins again. It runs only while it
// has events to handle: its goroutine starts with a kick (a membership
// change, the session's end, the topic's growth, a run's end, close) and
// ends once nothing is pending, so an idle member keeps none. Its state
// (sess, first) is touched only by the goroutine running it.

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
	if r.dropped.Load() || m.closing() {
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
			if !r.dropped.Load() {
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
		r.dropped.Store(true)
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
			r.paused.Store(m.pausedLocked(q.Queue))
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

// committer commits the cursors of owned queues whenever they may have
// moved, until every queue is released or it has been idle for
// workerIdle (the next markDirty starts it again).
func (m *groupMember) committer() {
	defer m.wg.Done()
	var runs []*queueRun
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case <-m.dirty:
			idle.Reset(workerIdle)
		case <-m.halt:
			return // every run committed its last offset on release
		case <-idle.C:
			if !m.retire() {
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
		for _, r := range runs {
			if err := r.commit(false); err != nil {
				m.report(err)
			}
		}
		clear(runs)
	}
}
