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
)

// maxFetchBatch bounds the messages one Read fetches.
const maxFetchBatch = 256

// readErrorBackoff is the wait before a fetch retries after a read error
// other than a reset (a disk error, say).
const readErrorBackoff = time.Second

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
	key   groupKey
	coord coordinator
	tags  map[string]struct{}

	t      *topicState
	ids    []QueueID
	sched  scheduler
	notify chan struct{} // membership changed
	dirty  chan struct{} // something may be committable
	stop   chan struct{} // closed by close: release everything
	halt   chan struct{} // closed once every queue is released: workers stop
	wg     sync.WaitGroup
	runSeq atomic.Int64

	first chan []*queueRun // the runs of the first rebalance, for Start

	mu      sync.Mutex // guards runs, state and lastErr
	runs    map[int]*queueRun
	state   int // memberNew, memberStarted, memberClosed
	lastErr string

	closeOnce sync.Once
	pull      bool // a PullConsumer's: Close does not wait for polled messages
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
		coord:  b.groups.coord,
		notify: make(chan struct{}, 1),
		dirty:  make(chan struct{}, 1),
		stop:   make(chan struct{}),
		halt:   make(chan struct{}),
		first:  make(chan []*queueRun, 1),
		runs:   map[int]*queueRun{},
	}
	if cfg.broadcast {
		m.scope = group + "@" + cfg.memberID
	}
	m.key = groupKey{scope: m.scope, topic: topic}
	if len(cfg.tags) > 0 {
		m.tags = map[string]struct{}{}
		for _, t := range cfg.tags {
			m.tags[t] = struct{}{}
		}
	}
	m.sched.init()
	return m
}

// start joins the group, starts the goroutines (spawn adds the caller's)
// and waits until the first assignment is taken or ctx is done.
func (m *groupMember) start(ctx context.Context, op string, spawn func()) error {
	m.mu.Lock()
	switch m.state {
	case memberClosed:
		m.mu.Unlock()
		return fmt.Errorf("ferry: %s: %w", op, ErrClosed)
	case memberStarted:
		m.mu.Unlock()
		return nil
	}
	t, err := m.b.topic(m.topic)
	if err != nil {
		m.mu.Unlock()
		return fmt.Errorf("ferry: %s: %w", op, err)
	}
	m.t = t
	m.ids = make([]QueueID, len(t.queues))
	for i := range m.ids {
		m.ids[i] = QueueID{Topic: m.topic, Queue: i}
	}
	if err := m.b.groups.add(m); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("ferry: %s: %w", op, err)
	}
	if err := m.coord.join(m.key, m.cfg.memberID, m.notify); err != nil {
		m.mu.Unlock()
		m.b.groups.remove(m)
		return fmt.Errorf("ferry: %s: %w", op, err)
	}
	m.state = memberStarted
	m.wg.Add(2)
	go m.loop()
	go m.committer()
	if spawn != nil {
		spawn()
	}
	m.mu.Unlock()

	var runs []*queueRun
	select {
	case runs = <-m.first:
	case <-ctx.Done():
		return fmt.Errorf("ferry: %s: %w", op, errors.Join(ctx.Err(), m.close()))
	}
	for _, r := range runs {
		select {
		case <-r.ready:
		case <-ctx.Done():
			return fmt.Errorf("ferry: %s: %w", op, errors.Join(ctx.Err(), m.close()))
		}
	}
	return nil
}

// close leaves the group, releases every queue (draining, committing and
// unlocking each), stops the goroutines and waits for them. Idempotent.
func (m *groupMember) close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		started := m.state == memberStarted
		m.state = memberClosed
		m.mu.Unlock()
		if !started {
			return
		}
		m.coord.leave(m.key, m.cfg.memberID)
		close(m.stop)
		m.wg.Wait()
		m.b.groups.remove(m)
	})
	return nil
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

// loop follows membership until stop, then releases every queue and stops
// the workers.
func (m *groupMember) loop() {
	defer m.wg.Done()
	first := true
	for {
		select {
		case <-m.stop:
			m.rebalance(nil, false)
			close(m.halt)
			m.markDirty()
			return
		case <-m.notify:
			mine, ok := m.allocate()
			runs := m.rebalance(mine, true)
			if first {
				if !ok {
					runs = nil // a broken split: Start does not wait for locks that may never come
				}
				m.first <- runs
				first = false
			}
		}
	}
}

// allocate returns the queues this member should own now. ok is false when
// the split is broken (reported).
func (m *groupMember) allocate() (mine []QueueID, ok bool) {
	if m.cfg.broadcast {
		return m.ids, true
	}
	members := m.coord.members(m.key)
	if !slices.Contains(members, m.cfg.memberID) {
		return nil, true // left: own nothing
	}
	a := m.cfg.allocator
	owners := make([]int, len(m.ids))
	var bad []string
	for _, member := range members {
		got, err := safeAllocate(a, m.group, member, m.ids, members)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		seen := map[int]bool{}
		for _, q := range got {
			if q.Topic != m.topic || q.Queue < 0 || q.Queue >= len(m.ids) {
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
			bad = append(bad, fmt.Sprintf("left queue %s unowned", m.ids[i]))
		case n > 1:
			bad = append(bad, fmt.Sprintf("gave queue %s to %d members", m.ids[i], n))
		}
	}
	slices.SortFunc(mine, QueueID.Compare)
	if len(bad) == 0 {
		m.mu.Lock()
		m.lastErr = ""
		m.mu.Unlock()
		return mine, true
	}
	err := fmt.Errorf("ferry: group %q: %w: allocator %T over %d members: %s", m.group, ErrInvalidAllocation, a, len(members), bad[0])
	if len(bad) > 1 {
		err = fmt.Errorf("%w (and %d more problems)", err, len(bad)-1)
	}
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
// parallel, each waiting for its drain) and then starts runs for the
// queues of mine not owned. It returns the runs it started.
func (m *groupMember) rebalance(mine []QueueID, take bool) []*queueRun {
	want := map[int]bool{}
	for _, q := range mine {
		want[q.Queue] = true
	}
	m.mu.Lock()
	var lost []*queueRun
	for q, r := range m.runs {
		if !want[q] {
			lost = append(lost, r)
		}
	}
	m.mu.Unlock()
	for _, r := range lost {
		r.cancel() // the run drains, commits and unlocks
	}
	for _, r := range lost {
		<-r.done
	}
	m.mu.Lock()
	for _, r := range lost {
		delete(m.runs, r.q)
	}
	var started []*queueRun
	if take {
		for _, q := range mine {
			if _, ok := m.runs[q.Queue]; ok {
				continue
			}
			r := m.newRun(q.Queue)
			m.runs[q.Queue] = r
			started = append(started, r)
			m.wg.Add(1)
			go r.run()
		}
	}
	m.mu.Unlock()
	if len(lost) > 0 || len(started) > 0 {
		m.b.log.Info("ferry: rebalance", "group", m.group, "topic", m.topic, "member", m.cfg.memberID,
			"released", len(lost), "taking", len(started), "queues", mine)
	}
	return started
}

// markDirty wakes the committer.
func (m *groupMember) markDirty() {
	select {
	case m.dirty <- struct{}{}:
	default:
	}
}

// committer commits the cursors of owned queues whenever they may have
// moved, until every queue is released.
func (m *groupMember) committer() {
	defer m.wg.Done()
	var runs []*queueRun
	for {
		select {
		case <-m.dirty:
		case <-m.halt:
			return // every run committed its last offset on release
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

// queueRun is the member's hold on one queue: lock, cursor, fetch loop,
// buffer. It lives from the take to the release.
type queueRun struct {
	m     *groupMember
	q     int
	id    QueueID
	queue Queue
	owner string // lock token
	buf   *Buffer

	ctx    context.Context // fetch context; cancelled to release
	cancel context.CancelFunc
	// hctx is the context handlers run under; cancelled when the drain
	// timeout gives up on them.
	hctx    context.Context
	hcancel context.CancelFunc
	ready   chan struct{} // closed once the queue is taken (or the take gave up)
	done    chan struct{} // closed when the run has released the queue

	owned     atomic.Bool // lock held and cursor loaded
	releasing atomic.Bool // no new takes from the buffer
	finished  atomic.Bool // released: retries of its messages are dropped

	inReady bool // guarded by m.sched.mu

	commitMu  sync.Mutex // guards committed and released
	committed int64
	released  bool
}

func (m *groupMember) newRun(q int) *queueRun {
	r := &queueRun{
		m: m, q: q, id: m.ids[q], queue: m.t.queues[q],
		owner: m.cfg.memberID + "#" + strconv.FormatInt(m.runSeq.Add(1), 10),
		buf:   newBuffer(m.cfg.buffer),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.hctx, r.hcancel = context.WithCancel(context.Background())
	r.committed = -1
	return r
}

// run takes the queue, fetches until released, then releases it.
func (r *queueRun) run() {
	m := r.m
	defer m.wg.Done()
	defer close(r.done)
	defer r.hcancel()
	readyOnce := sync.OnceFunc(func() { close(r.ready) })
	defer readyOnce()
	if err := m.coord.lock(r.ctx, m.key, r.q, r.owner); err != nil {
		r.finished.Store(true)
		return
	}
	defer m.coord.unlock(m.key, r.q, r.owner)
	start, err := r.load()
	if err != nil {
		if r.ctx.Err() == nil {
			m.report(err) // the queue stays locked and idle until a rebalance or Close
		}
		r.finished.Store(true)
		<-r.ctx.Done()
		return
	}
	r.buf.Reset(start)
	r.owned.Store(true)
	readyOnce()
	r.fetch()
	r.release()
}

// load reads the committed cursor, picks the start offset (WithStartFrom
// without a cursor, a reset outside the retained range) and commits it.
func (r *queueRun) load() (int64, error) {
	m := r.m
	offs, err := m.b.cursors.Load(r.ctx, m.topic, m.scope, len(m.ids))
	if err != nil {
		return 0, fmt.Errorf("ferry: take %s: %w", r.id, err)
	}
	m.b.groups.register(m.topic, m.scope, len(m.ids), offs)
	cur := offs[r.q]
	oldest, next := r.queue.Offsets()
	start := cur
	switch {
	case cur < 0 && m.cfg.startFrom == Latest:
		start = next
	case cur < 0:
		start = oldest
	case cur < oldest || cur > next:
		start = r.resetTo(cur)
	}
	if start != cur {
		if err := m.b.cursors.Commit(r.ctx, m.topic, m.scope, r.q, start); err != nil {
			return 0, fmt.Errorf("ferry: take %s: %w", r.id, err)
		}
	}
	r.commitMu.Lock()
	r.committed = start
	r.commitMu.Unlock()
	r.releaseBlocked(start)
	return start, nil
}

// resetTo returns where a consumer at offset from, outside the retained
// range, goes on, and reports the reset.
func (r *queueRun) resetTo(from int64) int64 {
	oldest, next := r.queue.Offsets()
	to := oldest
	if from > next {
		to = next
	}
	m := r.m
	m.b.log.Warn("ferry: cursor reset", "group", m.scope, "queue", r.id.String(), "from", from, "to", to)
	if m.cfg.onReset != nil {
		m.cfg.onReset(r.id, from, to)
	}
	return to
}

// fetch reads batches from the queue into the buffer until released.
func (r *queueRun) fetch() {
	m := r.m
	scratch := make([]*EnhancedMessage, min(maxFetchBatch, max(1, r.buf.highMsgs)))
	for {
		next := r.buf.Next()
		n, err := r.queue.Read(r.ctx, next, scratch)
		if err != nil {
			switch {
			case r.ctx.Err() != nil:
				return
			case errors.Is(err, ErrOffsetOutOfRange):
				to := r.resetTo(next)
				if to < next {
					r.buf.Reset(to)
				} else {
					r.buf.Advance(to)
				}
				m.markDirty()
				continue
			case errors.Is(err, ErrClosed):
				<-r.ctx.Done() // the broker is closing; it closes us too
				return
			}
			m.report(fmt.Errorf("ferry: fetch %s: %w", r.id, err))
			t := time.NewTimer(readErrorBackoff)
			select {
			case <-t.C:
			case <-r.ctx.Done():
				t.Stop()
				return
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
		for len(batch) > 0 {
			k, err := r.buf.Put(r.ctx, batch)
			if k > 0 {
				m.sched.push(r)
			}
			if err != nil {
				clear(scratch)
				return // released while paused
			}
			batch = batch[k:]
		}
		r.buf.Advance(last + 1)
		clear(scratch[:n])
		m.markDirty()
	}
}

// release stops takes, waits for the in-flight messages up to the drain
// timeout, commits and marks the run finished. The caller unlocks.
func (r *queueRun) release() {
	m := r.m
	r.releasing.Store(true)
	r.buf.Close() // no take after this: the drain below is final
	timeout := m.cfg.drainTimeout
	if m.pull && m.closing() {
		timeout = 0 // Commit is refused after Close: nothing in flight can finish
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err := r.buf.WaitDrained(ctx)
	cancel()
	if err != nil && timeout > 0 {
		st := r.buf.Stats()
		m.b.log.Warn("ferry: drain timeout, abandoning in-flight messages", "group", m.scope,
			"queue", r.id.String(), "in_flight", st.InFlight, "timeout", m.cfg.drainTimeout)
	}
	if err != nil {
		r.hcancel()
	}
	if err := r.commit(true); err != nil {
		m.report(err)
	}
	r.finished.Store(true)
	r.owned.Store(false)
}

// commit stores the buffer's committable offset if it moved. final marks
// the run released: no commit from it follows, so a slow committer cannot
// move the cursor back after the next owner took the queue.
func (r *queueRun) commit(final bool) error {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	if r.released || !r.owned.Load() {
		return nil
	}
	if final {
		r.released = true
	}
	off := r.buf.Committable()
	if off == r.committed {
		return nil
	}
	m := r.m
	if err := m.b.cursors.Commit(context.Background(), m.topic, m.scope, r.q, off); err != nil {
		return fmt.Errorf("ferry: commit %s at %d: %w", r.id, off, err)
	}
	r.committed = off
	r.releaseBlocked(off)
	return nil
}

// releaseBlocked lets a Block queue drop what every group is done with.
func (r *queueRun) releaseBlocked(off int64) {
	m := r.m
	if m.t.meta.Retention.Overflow != Block {
		return
	}
	if rel, ok := r.queue.(Releaser); ok {
		rel.Release(m.b.groups.committedTo(m.topic, m.scope, r.q, off))
	}
}

// scheduler hands queue runs with pending messages, and due retries, to
// whoever takes messages (workers or Poll). Wakeups go through a channel
// of capacity 1: a taker that leaves work behind passes the signal on.
type scheduler struct {
	mu      sync.Mutex // guards ready, retries and every run's inReady
	ready   []*queueRun
	retries []*retryItem
	wake    chan struct{}
}

func (s *scheduler) init() { s.wake = make(chan struct{}, 1) }

func (s *scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push lists r as having pending messages.
func (s *scheduler) push(r *queueRun) {
	s.mu.Lock()
	if r.inReady {
		s.mu.Unlock()
		return
	}
	r.inReady = true
	s.ready = append(s.ready, r)
	s.mu.Unlock()
	s.signal()
}

// pushRetry lists a retry that is due.
func (s *scheduler) pushRetry(it *retryItem) {
	s.mu.Lock()
	s.retries = append(s.retries, it)
	s.mu.Unlock()
	s.signal()
}

// next waits for a due retry or a run with pending messages, until halt is
// closed or ctx is done (nil, nil).
func (s *scheduler) next(ctx context.Context, halt <-chan struct{}) (*queueRun, *retryItem) {
	for {
		s.mu.Lock()
		var r *queueRun
		var it *retryItem
		if len(s.retries) > 0 {
			it = s.retries[0]
			s.retries[0] = nil
			s.retries = s.retries[1:]
		} else {
			for len(s.ready) > 0 && r == nil {
				r = s.ready[0]
				s.ready[0] = nil
				s.ready = s.ready[1:]
				r.inReady = false
				if r.releasing.Load() {
					r = nil
				}
			}
		}
		more := len(s.retries) > 0 || len(s.ready) > 0
		s.mu.Unlock()
		if more {
			s.signal()
		}
		if r != nil || it != nil {
			return r, it
		}
		select {
		case <-s.wake:
		case <-halt:
			return nil, nil
		case <-ctx.Done():
			return nil, nil
		}
	}
}
