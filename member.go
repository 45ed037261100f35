package ferry

import (
	"context"
	"fmt"
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
	// for it anyway. Only that turn: what comes after (a Close, say, whose
	// release may wait for a slow cursor load) goes on in a goroutine of
	// its own, so that Start returns as its ctx or Close says.
	if m.kicks.Add(1) == 1 {
		m.loopFirst()
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
	queues := -1 // unknown before the member joined
	if v := m.view.Load(); v != nil {
		queues = len(v.ids)
	}
	if t, err := m.b.topic(m.topic); err == nil {
		queues = max(queues, len(t.queues)) // AddQueues shows here before in the view
	}
	for _, id := range ids {
		if id.Topic != m.topic || id.Queue < 0 || (queues >= 0 && id.Queue >= queues) {
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
		if r.h.owned() && r.h.held(holdPause) {
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
		if r.h.owned() {
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
