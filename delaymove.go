package ferry

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Moving delayed messages: the broker that holds the delay lock moves
// every level, one mover per level reading its level in order and handing
// each message to the dispatcher, which writes it down a level or to its
// target when due (see delay.go).

// serve takes the delay lock (level 0's lock in group delayGroup: one
// broker moves every level, so that one dispatcher sees every level's
// front) and moves the levels while it holds it, until the delayer stops.
func (d *delayer) serve() {
	defer d.wg.Done()
	g := GroupKey{Scope: delayGroup, Topic: delayTopic(0)}
	for d.ctx.Err() == nil {
		sess, err := d.b.groups.coord.Join(d.ctx, g, d.member)
		if err != nil {
			d.fail("join", err)
			continue
		}
		if lease, err := sess.Lock(d.ctx, 0); err != nil {
			d.fail("lock", err)
		} else {
			d.hold(sess, lease)
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = lease.Release(rctx)
			cancel()
		}
		lctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = sess.Leave(lctx)
		cancel()
	}
}

// hold moves every level while lease holds the delay lock (and sess
// lives, and the delayer runs): it makes the levels that do not exist
// yet, so that no level it does not read can hold a message, takes them
// all at once from their committed cursors and runs a mover per level.
// When it ends, their actions still in the heap are dropped, for the
// lock's next holder to read again.
func (d *delayer) hold(sess Session, lease Lease) {
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
	defer func() {
		cancel()
		<-lost
	}()
	var levels [delayLevels]*level
	for n := range levels {
		for {
			lv, err := d.level(rctx, n)
			if err == nil {
				levels[n] = lv
				break
			}
			if rctx.Err() != nil {
				return
			}
			d.fail("make level "+strconv.Itoa(n), err)
		}
	}
	d.ownAll(rctx, levels, lease)
	var movers sync.WaitGroup
	for _, lv := range levels {
		movers.Add(1)
		go func() {
			defer movers.Done()
			d.readLoop(rctx, lv)
		}()
	}
	movers.Wait() // they return once rctx ends
	d.disownAll(levels, lease)
}

// fail reports a failure of the delays' service and waits a little.
func (d *delayer) fail(what string, err error) {
	if d.ctx.Err() != nil {
		return
	}
	d.b.log.Error("ferry: delayed delivery: "+what, "err", err)
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.ctx.Done():
	}
}

// ownAll starts an ownership of every level, each read from its
// committed cursor on, all at once: the dispatcher acts on none of their
// messages before every level's front is known.
func (d *delayer) ownAll(ctx context.Context, levels [delayLevels]*level, lease Lease) {
	var starts, committed [delayLevels]int64
	for n, lv := range levels {
		start := int64(-1)
		if cur, err := d.b.cursors.Load(ctx, lv.t.meta.Name, delayGroup, 1); err == nil {
			start = cur[0]
		} else if ctx.Err() == nil {
			d.b.log.Error("ferry: delayed delivery: load cursor", "topic", lv.t.meta.Name, "err", err)
		}
		// A level with no cursor yet gets one at the next commit, so that
		// its group's lag (Broker.Lag) is known: only level 0's group has
		// members.
		committed[n] = start
		oldest, next := lv.queue.Offsets()
		if start < oldest || start > next {
			start = oldest
		}
		starts[n] = start
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for n, lv := range levels {
		lv.owned, lv.token = true, lease.Token()
		lv.epoch++
		lv.read, lv.base, lv.committed = starts[n], starts[n], committed[n]
		lv.done = lv.done[:0]
		lv.front, lv.idle = time.Time{}, true
	}
}

// disownAll ends the ownership of every level: their actions in the heap
// are dropped (the next owner reads them again), and, unless the lease
// was lost, their cursors are committed.
func (d *delayer) disownAll(levels [delayLevels]*level, lease Lease) {
	select {
	case <-lease.Lost():
	default:
		for _, lv := range levels {
			d.commit(lv)
		}
	}
	d.mu.Lock()
	for _, lv := range levels {
		lv.owned = false
		lv.epoch++
	}
	clear(d.due)
	d.due = d.due[:0]
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
			d.fail("read "+lv.t.meta.Name, err)
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
			if !d.sleepUntil(ctx, a.hop.Add(-delayWindow)) {
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
	var at, hop int64
	var q int
	var inc uint64
	var topic, tag string
	var err error
	if _, old := msg.Headers[headerDelayHop]; old { // as an earlier version stored it
		var err1, err2, err3 error
		at, err1 = strconv.ParseInt(msg.Headers[HeaderDeliverAt], 10, 64)
		hop, err2 = strconv.ParseInt(msg.Headers[headerDelayHop], 10, 64)
		q, err3 = strconv.Atoi(msg.Headers[headerDelayQueue])
		inc, _ = strconv.ParseUint(msg.Headers[headerDelayIncarnation], 10, 64) // none: 0
		topic, tag = msg.Headers[headerDelayTopic], msg.Tag
		err = errors.Join(err1, err2, err3)
	} else {
		at, hop, q, inc, topic, tag, err = parseDelayTag(msg.Tag)
	}
	if err != nil || topic == "" || q < 0 {
		return nil, fmt.Errorf("%w: delay tag: %v", ErrInvalidMessage, err)
	}
	a := &delayAction{deliverAt: time.Unix(0, at), hop: time.Unix(0, hop), target: QueueID{Topic: topic, Queue: q}, inc: inc, tag: tag, msg: msg}
	// With less than two windows left after its hop, it is delivered when
	// due; else it moves down when its hop ends.
	if a.deliverAt.Sub(a.hop) < 2*delayWindow {
		a.at = a.deliverAt
	} else {
		a.at = a.hop
	}
	return a, nil
}

// parseDelayTag reads the tag of a level's message (see delayedMessage).
func parseDelayTag(v string) (at, hop int64, q int, inc uint64, topic, tag string, err error) {
	v, tag, ok := strings.Cut(v, "|")
	if !ok {
		return 0, 0, 0, 0, "", "", errors.New("no '|'")
	}
	f := func() string {
		s, rest, _ := strings.Cut(v, ",")
		v = rest
		return s
	}
	var err1, err2, err3, err4 error
	at, err1 = strconv.ParseInt(f(), 10, 64)
	hop, err2 = strconv.ParseInt(f(), 10, 64)
	q, err3 = strconv.Atoi(f())
	inc, err4 = strconv.ParseUint(f(), 10, 64)
	return at, hop, q, inc, v, tag, errors.Join(err1, err2, err3, err4)
}

// sleepUntil waits until the delayer's clock reads at; false if ctx
// ended first.
func (d *delayer) sleepUntil(ctx context.Context, at time.Time) bool {
	for {
		now := d.clock.Now()
		w := at.Sub(now)
		if w <= 0 {
			return true
		}
		ch := make(chan struct{})
		t := d.clock.AfterFunc(w, func() { close(ch) })
		if d.clock.Now().Sub(now) > clockSlack {
			t.Stop() // set late (see clockSlack): set it again
			continue
		}
		select {
		case <-ch:
			return true
		case <-ctx.Done():
			t.Stop()
			return false
		}
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
// will read acts before now, the clock reading taken before the check (a
// write the check does not see is placed no earlier than the level's
// floor, which the check raises to now: see level.placeTime). One
// reading serves every level: the owner checks all of them, most often
// empty. d.mu is held.
func (d *delayer) limit(now time.Time) time.Time {
	lim := now
	for _, lv := range d.levels {
		if lv == nil || !lv.owned || !lv.front.Before(lim) {
			continue
		}
		if lv.idle {
			lv.wmu.Lock()
			_, next := lv.queue.Offsets()
			if now.After(lv.floor) {
				lv.floor = now
			}
			lv.wmu.Unlock()
			if lv.read >= next {
				lv.front = now
				continue
			}
		}
		lim = lv.front
	}
	return lim
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

type actionHeap []*delayAction

func (h actionHeap) Len() int { return len(h) }

func (h actionHeap) Less(i, j int) bool {
	if c := h[i].at.Compare(h[j].at); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}

func (h actionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *actionHeap) Push(x any) { *h = append(*h, x.(*delayAction)) }

func (h *actionHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return a
}
