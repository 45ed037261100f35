package ferry

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Delayed delivery. A message sent with a DeliverAt in the future waits in
// a delay level: an ordinary topic of one queue, "%DELAY%<n>" for n from 0
// to delayLevels-1, written like any other, so it is as durable as the
// storage. Level n ≥ 1 takes messages with between delayWindow·2ⁿ and
// delayWindow·2ⁿ⁺¹ to wait, and keeps each for delayWindow·2ⁿ (its hop),
// a constant per level, so every level is FIFO in the time its hop ends;
// level 0 takes those with less than two windows to wait (no hop). When
// its hop ends a message has less than half its wait left: it moves down
// to a lower level (a write), or, with less than two windows left, is
// delivered to its topic when due. A wait of days takes about twenty
// hops, spread over the wait.
//
// One mover per level (over a shared storage and coordinator, one in all
// the brokers: it holds the level's lock, group delayGroup) reads its
// level in order and hands each message to the broker's dispatcher
// delayWindow before its hop ends; it reads no further while the next
// message is not that near, so memory holds only messages due within a
// few windows, however many wait, and no timer per message. The
// dispatcher, one goroutine, carries out what falls due in the order of
// due times, and no further than every level's front (the earliest time
// a message it has not handed over yet can act at), so a key's messages
// with ordered due times arrive in that order even when a mover lags.
// A level's message is finished once it moved, and its cursor committed
// after that: a crash in between moves it again (at least once). Nothing
// is delivered before its time on the broker's clock.
const (
	delayTopicPrefix = "%DELAY%"
	delayGroup       = "ferry-delay"
	// delayWindow is the shortest hop, and how long before its time an
	// action enters the dispatcher's heap.
	delayWindow = 50 * time.Millisecond
	// delayLevels counts the levels: the longest hop, delayWindow·2³¹,
	// is about three years.
	delayLevels = 32
)

// Headers of a delayed message. HeaderDeliverAt stays on the message
// delivered to its topic: when it was due, in Unix nanoseconds.
const (
	HeaderDeliverAt  = "ferry-deliver-at"
	headerDelayTopic = "ferry-delay-topic"
	headerDelayQueue = "ferry-delay-queue"
	headerDelayHop   = "ferry-delay-hop"
)

// delayRetention keeps a level's messages until they moved: Block with no
// bound (and no age: a store may expire by age whatever was released), so
// that nothing waiting is ever dropped, and the mover releases what it
// committed (a memory queue drops it at once, a file queue its sealed
// segments wholly released).
var delayRetention = Retention{MaxMessages: Unlimited, MaxBytes: Unlimited, Overflow: Block}

// IsDelayTopic reports whether name is one of the internal topics where
// delayed messages wait.
func IsDelayTopic(name string) bool { return strings.HasPrefix(name, delayTopicPrefix) }

func delayTopic(n int) string { return delayTopicPrefix + strconv.Itoa(n) }

// delayLevelOf returns the level of a delay topic's name.
func delayLevelOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, delayTopicPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= delayLevels || delayTopic(n) != name {
		return 0, false
	}
	return n, true
}

// delayLevel returns the level for a wait of r, and the hop there:
// level 0 (no hop) below two windows, else the longest hop of
// delayWindow·2ⁿ no longer than r.
func delayLevel(r time.Duration) (int, time.Duration) {
	if r < 2*delayWindow {
		return 0, 0
	}
	n := min(bits.Len64(uint64(r/delayWindow))-1, delayLevels-1)
	return n, delayWindow << n
}

// delayer moves the broker's delayed messages; see above.
type delayer struct {
	b      *Broker
	clock  Clock
	member string // its member ID in each level's group
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}

	mu      sync.Mutex // guards the fields below and those of the levels marked so
	closed  bool
	started bool // the dispatcher and the committer run
	levels  [delayLevels]*level
	due     actionHeap
	seq     uint64
}

// level is a delay level and its mover's state.
type level struct {
	n     int
	t     *topicState
	queue Queue
	// wmu is held by a write to the level around its clock reading, and
	// by a check that the mover has read everything: a write is then
	// either seen by the check or stamped after it.
	wmu sync.Mutex

	// Under delayer.mu:
	// starting holds the dispatcher back while the mover takes the
	// level for the first time (for a second at most: then another
	// broker must hold it).
	starting bool
	owned    bool
	epoch    uint64 // counts ownerships: an action of an older one is dropped
	token    uint64 // the lease's fencing token
	read     int64  // the next offset to read
	// front is no later than the action time of any message of the level
	// not yet handed to the dispatcher (while owned).
	front time.Time
	idle  bool // everything read was handed over; the mover waits for more
	// The offsets handed over from base on, and which are done: the
	// cursor can move to base.
	base      int64
	done      []bool
	committed int64
}

// delayAction is a message of a level, handed to the dispatcher.
type delayAction struct {
	at        time.Time // when to act
	hop       time.Time // when its hop ends
	seq       uint64
	deliverAt time.Time
	target    QueueID
	msg       *EnhancedMessage // as stored in the level
	lv        *level
	epoch     uint64
}

func newDelayer(b *Broker, clock Clock) *delayer {
	d := &delayer{b: b, clock: clock, wake: make(chan struct{}, 1),
		member: "delay-" + bornAddress + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(memberSeq.Add(1), 10)}
	d.ctx, d.stop = context.WithCancel(context.Background())
	return d
}

// place writes em, stamped and routed to target, to the delay level for
// a delivery at at. wait false: a full level queue is ErrQueueFull.
func (d *delayer) place(ctx context.Context, em *EnhancedMessage, target QueueID, at time.Time, wait bool) (SendResult, error) {
	n, _ := delayLevel(at.Sub(d.clock.Now()))
	for {
		lv, err := d.level(ctx, n)
		if err != nil {
			return SendResult{}, err
		}
		// The level and the hop come from a clock reading under the
		// level's write lock, so that the level's messages are in the
		// order of their hops.
		lv.wmu.Lock()
		now := d.clock.Now()
		m, hop := delayLevel(at.Sub(now))
		if m != n {
			lv.wmu.Unlock()
			n = m // the clock moved on meanwhile
			continue
		}
		w := delayedMessage(lv, em, target, at, now.Add(hop))
		err = write(ctx, lv.queue, w, wait)
		lv.wmu.Unlock()
		if err != nil {
			return SendResult{}, err
		}
		return SendResult{ID: em.ID, Queue: QueueID{Topic: lv.t.meta.Name}, Offset: w.Offset, DeliverAt: at, Target: target}, nil
	}
}

// delayed is a message for placeBatch: stamped, routed to target, due at
// at; res is filled in once it is written.
type delayed struct {
	em     *EnhancedMessage
	target QueueID
	at     time.Time
	res    *SendResult
}

// placeBatch is place for several messages, with one write per level
// (in their order within it); a message whose level changes between the
// two clock readings is placed alone. On error, the messages of the
// levels written before stay written (their results filled in).
func (d *delayer) placeBatch(ctx context.Context, ms []delayed) error {
	now := d.clock.Now()
	var byLevel [delayLevels][]int
	for i, m := range ms {
		n, _ := delayLevel(m.at.Sub(now))
		byLevel[n] = append(byLevel[n], i)
	}
	for n, idx := range byLevel {
		if len(idx) == 0 {
			continue
		}
		lv, err := d.level(ctx, n)
		if err != nil {
			return err
		}
		var alone []int
		batch := make([]*EnhancedMessage, 0, len(idx))
		lv.wmu.Lock()
		now := d.clock.Now()
		for _, i := range idx {
			m := ms[i]
			k, hop := delayLevel(m.at.Sub(now))
			if k != n {
				alone = append(alone, i)
				continue
			}
			batch = append(batch, delayedMessage(lv, m.em, m.target, m.at, now.Add(hop)))
		}
		_, err = lv.queue.Write(ctx, batch)
		lv.wmu.Unlock()
		if err != nil {
			return err
		}
		k := 0
		for _, i := range idx {
			if slices.Contains(alone, i) {
				continue
			}
			w := batch[k]
			k++
			*ms[i].res = SendResult{ID: w.ID, Queue: QueueID{Topic: lv.t.meta.Name}, Offset: w.Offset, DeliverAt: ms[i].at, Target: ms[i].target}
		}
		for _, i := range alone {
			res, err := d.place(ctx, ms[i].em, ms[i].target, ms[i].at, true)
			if err != nil {
				return err
			}
			*ms[i].res = res
		}
	}
	return nil
}

// delayedMessage returns em as level lv stores it: bound for target at at,
// its hop ending at hop.
func delayedMessage(lv *level, em *EnhancedMessage, target QueueID, at, hop time.Time) *EnhancedMessage {
	h := make(map[string]string, len(em.Headers)+4)
	maps.Copy(h, em.Headers)
	h[HeaderDeliverAt] = strconv.FormatInt(at.UnixNano(), 10)
	h[headerDelayTopic] = target.Topic
	h[headerDelayQueue] = strconv.Itoa(target.Queue)
	h[headerDelayHop] = strconv.FormatInt(hop.UnixNano(), 10)
	return &EnhancedMessage{
		Message: Message{Topic: lv.t.meta.Name, Key: em.Key, Tag: em.Tag, Headers: h, Body: em.Body},
		ID:      em.ID, BornUnixNano: em.BornUnixNano, Origin: em.Origin,
	}
}

// write writes one message to q; wait false uses TryWrite where q has it.
func write(ctx context.Context, q Queue, m *EnhancedMessage, wait bool) error {
	one := []*EnhancedMessage{m}
	if tw, ok := q.(TryWriter); ok && !wait {
		_, err := tw.TryWrite(one)
		return err
	}
	_, err := q.Write(ctx, one)
	return err
}

// level returns level n, creating its topic if needed, and makes sure
// its mover runs.
func (d *delayer) level(ctx context.Context, n int) (*level, error) {
	d.mu.Lock()
	lv := d.levels[n]
	d.mu.Unlock()
	if lv != nil {
		return lv, nil
	}
	name := delayTopic(n)
	if _, err := d.b.topic(name); errors.Is(err, ErrTopicNotFound) {
		err = d.b.CreateTopic(ctx, TopicMeta{Name: name, Queues: 1, Retention: delayRetention})
		if err != nil && !errors.Is(err, ErrTopicExists) {
			return nil, err
		}
	}
	return d.run(n)
}

// run starts level n's mover (and the dispatcher and committer) unless it
// runs; after close it only returns the level.
func (d *delayer) run(n int) (*level, error) {
	t, err := d.b.topic(delayTopic(n))
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if lv := d.levels[n]; lv != nil {
		return lv, nil
	}
	lv := &level{n: n, t: t, queue: t.queues[0]}
	d.levels[n] = lv
	if d.closed {
		return lv, nil // written now, moved after a restart
	}
	lv.starting = true
	if !d.started {
		d.started = true
		d.wg.Add(2)
		go d.dispatch()
		go d.commitLoop()
	}
	d.wg.Add(1)
	go d.move(lv)
	return lv, nil
}

// close stops the movers, the dispatcher and the committer and waits for
// them. What they had not finished stays in the levels, to move after a
// restart (or by another broker over the same storage).
func (d *delayer) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.stop()
	d.wg.Wait()
	d.mu.Lock()
	clear(d.due)
	d.due = nil
	d.mu.Unlock()
}

// move is a level's mover: while it holds the level's lock in the
// coordinator it reads the level in order and hands each message to the
// dispatcher once its hop ends within delayWindow.
func (d *delayer) move(lv *level) {
	defer d.wg.Done()
	g := GroupKey{Scope: delayGroup, Topic: lv.t.meta.Name}
	for d.ctx.Err() == nil {
		sess, err := d.b.groups.coord.Join(d.ctx, g, d.member)
		if err != nil {
			d.fail("join", lv, err)
			continue
		}
		if lease, err := d.lock(sess, lv); err != nil {
			d.fail("lock", lv, err)
		} else {
			d.own(lv, sess, lease)
			rctx, cancel := context.WithCancel(d.ctx)
			lost := make(chan struct{})
			go func() { // ends with the lease or the delayer
				select {
				case <-lease.Lost():
				case <-sess.Done():
				case <-rctx.Done():
				}
				cancel()
				close(lost)
			}()
			d.readLoop(rctx, lv)
			cancel()
			<-lost
			d.disown(lv, lease)
			rctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
			_ = lease.Release(rctx2)
			cancel2()
		}
		lctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = sess.Leave(lctx)
		cancel()
	}
}

// lock locks lv's queue in sess. The first time, it stops holding the
// dispatcher back after a second of waiting: the level is someone else's.
func (d *delayer) lock(sess Session, lv *level) (Lease, error) {
	d.mu.Lock()
	starting := lv.starting
	d.mu.Unlock()
	if starting {
		ctx, cancel := context.WithTimeout(d.ctx, time.Second)
		lease, err := sess.Lock(ctx, 0)
		cancel()
		if err == nil {
			return lease, nil // own() ends the start
		}
		d.mu.Lock()
		lv.starting = false
		d.mu.Unlock()
		d.signal()
		if d.ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
	}
	return sess.Lock(d.ctx, 0)
}

// fail reports a failure of a level's mover and waits a little (false if
// the delayer stopped meanwhile).
func (d *delayer) fail(what string, lv *level, err error) {
	if d.ctx.Err() != nil {
		return
	}
	d.b.log.Error("ferry: delayed delivery: "+what, "topic", lv.t.meta.Name, "err", err)
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.ctx.Done():
	}
}

// own starts an ownership of lv: reading from the committed cursor.
func (d *delayer) own(lv *level, sess Session, lease Lease) {
	start := int64(-1)
	if cur, err := d.b.cursors.Load(d.ctx, lv.t.meta.Name, delayGroup, 1); err == nil {
		start = cur[0]
	} else {
		d.b.log.Error("ferry: delayed delivery: load cursor", "topic", lv.t.meta.Name, "err", err)
	}
	oldest, next := lv.queue.Offsets()
	if start < oldest || start > next {
		start = oldest
	}
	d.mu.Lock()
	lv.owned, lv.starting, lv.token = true, false, lease.Token()
	lv.epoch++
	lv.read, lv.base, lv.committed = start, start, start
	lv.done = lv.done[:0]
	lv.front, lv.idle = time.Time{}, true
	d.mu.Unlock()
}

// disown ends an ownership of lv: its actions in the heap are dropped
// (the next owner reads them again), and, unless the lease was lost, the
// cursor is committed.
func (d *delayer) disown(lv *level, lease Lease) {
	select {
	case <-lease.Lost():
	default:
		d.commit(lv)
	}
	d.mu.Lock()
	lv.owned = false
	lv.epoch++
	kept := d.due[:0]
	for _, a := range d.due {
		if a.lv != lv {
			kept = append(kept, a)
		}
	}
	clear(d.due[len(kept):])
	d.due = kept
	heap.Init(&d.due)
	d.mu.Unlock()
	d.signal()
}

// readLoop reads lv from lv.read on, handing messages to the dispatcher,
// until ctx ends.
func (d *delayer) readLoop(ctx context.Context, lv *level) {
	buf := make([]*EnhancedMessage, 256)
	for {
		d.mu.Lock()
		lv.idle = true
		off := lv.read
		d.mu.Unlock()
		d.signal() // the dispatcher may wait for this level to catch up
		n, err := lv.queue.Read(ctx, off, buf)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrOffsetOutOfRange) {
				oldest, _ := lv.queue.Offsets()
				d.b.log.Error("ferry: delayed delivery: level cut short, reading on from its oldest message", "topic", lv.t.meta.Name, "from", off, "oldest", oldest)
				d.mu.Lock()
				lv.read, lv.base, lv.done = oldest, oldest, lv.done[:0]
				d.mu.Unlock()
				continue
			}
			d.fail("read", lv, err)
			continue
		}
		for i, msg := range buf[:n] {
			buf[i] = nil
			a, err := parseDelayed(msg)
			if err != nil {
				d.b.log.Error("ferry: delayed delivery: dropping a message that is not a delayed one", "queue", msg.QueueID().String(), "offset", msg.Offset, "err", err)
				d.mu.Lock()
				lv.idle = false
				lv.read = msg.Offset + 1
				lv.done = append(lv.done, true)
				d.advance(lv)
				d.mu.Unlock()
				continue
			}
			d.mu.Lock()
			lv.idle = false
			lv.front = a.hop
			d.mu.Unlock()
			if w := a.hop.Add(-delayWindow).Sub(d.clock.Now()); w > 0 && !d.sleep(ctx, w) {
				return
			}
			d.mu.Lock()
			if ctx.Err() != nil {
				d.mu.Unlock()
				return
			}
			a.lv, a.epoch = lv, lv.epoch
			lv.read = msg.Offset + 1
			lv.done = append(lv.done, false)
			d.seq++
			a.seq = d.seq
			heap.Push(&d.due, a)
			d.mu.Unlock()
			d.signal()
		}
	}
}

// parseDelayed reads a level's message.
func parseDelayed(msg *EnhancedMessage) (*delayAction, error) {
	at, err1 := strconv.ParseInt(msg.Headers[HeaderDeliverAt], 10, 64)
	hop, err2 := strconv.ParseInt(msg.Headers[headerDelayHop], 10, 64)
	q, err3 := strconv.Atoi(msg.Headers[headerDelayQueue])
	topic := msg.Headers[headerDelayTopic]
	if err := errors.Join(err1, err2, err3); err != nil || topic == "" || q < 0 {
		return nil, fmt.Errorf("%w: delay headers: %v", ErrInvalidMessage, err)
	}
	a := &delayAction{deliverAt: time.Unix(0, at), hop: time.Unix(0, hop), target: QueueID{Topic: topic, Queue: q}, msg: msg}
	// With less than two windows left after its hop, it is delivered when
	// due; else it moves down when its hop ends.
	if a.deliverAt.Sub(a.hop) < 2*delayWindow {
		a.at = a.deliverAt
	} else {
		a.at = a.hop
	}
	return a, nil
}

// sleep waits w on the delayer's clock; false if ctx ended first.
func (d *delayer) sleep(ctx context.Context, w time.Duration) bool {
	ch := make(chan struct{})
	t := d.clock.AfterFunc(w, func() { close(ch) })
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

func (d *delayer) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// limit returns how far the dispatcher may act now: up to now, and no
// further than any owned level's front (so that actions run in the order
// of their times, across levels, even when a mover lags). A level waiting
// for more messages is checked: if it has read everything, nothing it
// will read acts before the time of the check. d.mu is held.
func (d *delayer) limit(now time.Time) time.Time {
	lim := now
	for _, lv := range d.levels {
		if lv == nil || !lv.owned && !lv.starting || !lv.front.Before(lim) {
			continue
		}
		if lv.idle {
			lv.wmu.Lock()
			t := d.clock.Now()
			_, next := lv.queue.Offsets()
			lv.wmu.Unlock()
			if lv.read >= next {
				lv.front = t
				if !t.Before(lim) {
					continue
				}
			}
		}
		lim = lv.front
	}
	return lim
}

// dispatch carries out the actions that fall due, in order, until the
// delayer stops.
func (d *delayer) dispatch() {
	defer d.wg.Done()
	var due []*delayAction
	for {
		d.mu.Lock()
		now := d.clock.Now()
		due = due[:0]
		held := false
		if len(d.due) > 0 && !d.due[0].at.After(now) {
			lim := d.limit(now)
			for len(d.due) > 0 && !d.due[0].at.After(lim) {
				a := heap.Pop(&d.due).(*delayAction)
				if a.at.Before(a.deliverAt) && !a.deliverAt.After(now) {
					// A move down that comes late: due already, it is
					// delivered in its due time's turn.
					a.at = a.deliverAt
					heap.Push(&d.due, a)
					continue
				}
				due = append(due, a)
			}
			held = len(d.due) > 0 && !d.due[0].at.After(now)
		}
		wait := time.Duration(-1)
		if len(due) == 0 && !held && len(d.due) > 0 {
			wait = d.due[0].at.Sub(now)
		}
		d.mu.Unlock()
		if len(due) > 0 {
			d.actAll(due, now)
			clear(due)
			if d.ctx.Err() != nil {
				return
			}
			continue
		}
		var t Timer
		if wait >= 0 {
			t = d.clock.AfterFunc(wait, d.signal)
		}
		select {
		case <-d.wake:
		case <-d.ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if d.ctx.Err() != nil {
			return
		}
	}
}

// actAll carries out due, in order. One that fails (a full or failing
// target) goes back to the heap with those after it, and the dispatcher
// pauses, so that the order holds.
func (d *delayer) actAll(due []*delayAction, now time.Time) {
	for i, a := range due {
		d.mu.Lock()
		stale := a.epoch != a.lv.epoch
		d.mu.Unlock()
		if stale {
			continue // the level changed hands: its next owner moves it
		}
		if d.act(a, now) {
			d.finish(a)
			continue
		}
		d.mu.Lock()
		for _, b := range due[i:] {
			heap.Push(&d.due, b)
		}
		d.mu.Unlock()
		t := time.NewTimer(retryAct)
		select {
		case <-t.C:
		case <-d.ctx.Done():
			t.Stop()
		}
		return
	}
}

// retryAct is how long (on the system clock) the dispatcher waits after
// an action that could not be carried out, before the next try.
const retryAct = 10 * time.Millisecond

// act delivers a when it is due by now (the time its turn was decided
// at: not a later reading, or it could jump the queue) or moves it down a
// level, and reports whether it did (false: try again later).
func (d *delayer) act(a *delayAction, now time.Time) bool {
	if a.deliverAt.After(now) { // down a level (its headers are set anew)
		if _, err := d.place(d.ctx, a.msg, a.target, a.deliverAt, false); err != nil {
			return d.failed(a, err)
		}
		return true
	}
	t, err := d.b.topic(a.target.Topic)
	if err != nil {
		if errors.Is(err, ErrTopicNotFound) {
			d.b.log.Error("ferry: delayed delivery: topic gone, dropping the message", "topic", a.target.Topic, "id", a.msg.ID.String())
			return true
		}
		return d.failed(a, err)
	}
	q := t.queues[a.target.Queue%len(t.queues)]
	em := &EnhancedMessage{
		Message: Message{Topic: t.meta.Name, Key: a.msg.Key, Tag: a.msg.Tag, Headers: stripDelay(a.msg.Headers), Body: a.msg.Body},
		ID:      a.msg.ID, BornUnixNano: a.msg.BornUnixNano, Origin: a.msg.Origin,
	}
	if err := write(d.ctx, q, em, false); err != nil {
		return d.failed(a, err)
	}
	return true
}

// failed reports a failed action; false: try again later.
func (d *delayer) failed(a *delayAction, err error) bool {
	if d.ctx.Err() == nil && !errors.Is(err, ErrQueueFull) {
		d.b.log.Error("ferry: delayed delivery: move failed, trying again", "to", a.target.String(), "id", a.msg.ID.String(), "err", err)
	}
	return false
}

// finish marks a's level message done.
func (d *delayer) finish(a *delayAction) {
	d.mu.Lock()
	defer d.mu.Unlock()
	lv := a.lv
	if a.epoch != lv.epoch {
		return
	}
	if i := a.msg.Offset - lv.base; i >= 0 && i < int64(len(lv.done)) {
		lv.done[i] = true
		d.advance(lv)
	}
}

// advance moves lv.base over the done prefix. d.mu is held.
func (d *delayer) advance(lv *level) {
	k := 0
	for k < len(lv.done) && lv.done[k] {
		k++
	}
	if k > 0 {
		lv.base += int64(k)
		lv.done = append(lv.done[:0], lv.done[k:]...)
	}
}

// commitInterval is how often the levels' cursors are committed.
const commitInterval = 100 * time.Millisecond

// commitLoop commits the owned levels' cursors every commitInterval.
func (d *delayer) commitLoop() {
	defer d.wg.Done()
	t := time.NewTicker(commitInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-d.ctx.Done():
			return
		}
		d.mu.Lock()
		levels := d.levels
		d.mu.Unlock()
		for _, lv := range levels {
			if lv != nil {
				d.commit(lv)
			}
		}
	}
}

// commit commits lv's cursor if it moved, fenced by the lease's token
// where the store can.
func (d *delayer) commit(lv *level) {
	d.mu.Lock()
	if !lv.owned || lv.base == lv.committed {
		d.mu.Unlock()
		return
	}
	off, token := lv.base, lv.token
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if fc, ok := d.b.cursors.(FencedCursorStore); ok {
		err = fc.CommitFenced(ctx, lv.t.meta.Name, delayGroup, 0, off, token)
	} else {
		err = d.b.cursors.Commit(ctx, lv.t.meta.Name, delayGroup, 0, off)
	}
	if err != nil {
		d.b.log.Error("ferry: delayed delivery: commit", "topic", lv.t.meta.Name, "offset", off, "err", err)
		return
	}
	d.mu.Lock()
	if lv.committed < off {
		lv.committed = off
	}
	d.mu.Unlock()
	if r, ok := lv.queue.(Releaser); ok {
		r.Release(off)
	}
}

// stripDelay returns h without the level's own headers (HeaderDeliverAt
// stays).
func stripDelay(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		switch k {
		case headerDelayTopic, headerDelayQueue, headerDelayHop:
			continue
		}
		out[k] = v
	}
	return out
}

type actionHeap []*delayAction

func (h actionHeap) Len() int { return len(h) }
func (h actionHeap) Less(i, j int) bool {
	if c := h[i].at.Compare(h[j].at); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h actionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *actionHeap) Push(x any)   { *h = append(*h, x.(*delayAction)) }
func (h *actionHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return a
}
