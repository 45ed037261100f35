package ferry

import (
	"container/heap"
	"errors"
	"time"
)

// The dispatcher: one goroutine carries out the due actions of the delay
// levels in the order of their times, parking a target that cannot take
// its message (see delay.go).

// What act did.
const (
	actFailed = iota // try again later
	acted
	requeued // due by the time it was to move down: back in the heap, as a delivery
)

// dispatch carries out the actions that fall due, in order, until the
// delayer stops.
func (d *delayer) dispatch() {
	defer d.wg.Done()
	var due []*delayAction
	var retry *time.Timer // the earliest parked target's retry, on the system clock
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
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
				if p := d.parked[a.target]; p != nil {
					p.acts = append(p.acts, a) // behind its target's first
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
		parked := len(d.parked) > 0
		d.mu.Unlock()
		if parked {
			if next, ok := d.retryParked(now); ok {
				if retry == nil {
					retry = time.AfterFunc(time.Until(next), d.signal)
				} else {
					retry.Reset(time.Until(next))
				}
			}
		}
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
			if d.clock.Now().Sub(now) > clockSlack {
				d.signal() // set late (see clockSlack): look again
			}
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
// target) parks its target with it: the actions for that target after it
// wait behind it, so that their order holds, and the others go on.
func (d *delayer) actAll(due []*delayAction, now time.Time) {
	for _, a := range due {
		d.mu.Lock()
		stale := a.epoch != a.lv.epoch
		p := d.parked[a.target]
		if p != nil {
			p.acts = append(p.acts, a)
		}
		d.mu.Unlock()
		if stale || p != nil {
			continue // stale: the level changed hands, its next owner moves it
		}
		switch d.act(a, now) {
		case acted:
			d.finish(a)
			continue
		case requeued:
			continue
		}
		d.mu.Lock()
		if d.parked == nil {
			d.parked = map[QueueID]*parkedTarget{}
		}
		d.parked[a.target] = &parkedTarget{acts: []*delayAction{a}, retry: time.Now().Add(retryAct)}
		d.mu.Unlock()
	}
}

// retryParked tries again the parked targets whose retry time came, each
// from its first action on, until one fails again (it stays parked, with
// the rest); it returns the earliest retry time still to come.
func (d *delayer) retryParked(now time.Time) (next time.Time, ok bool) {
	d.mu.Lock()
	var ready []QueueID
	for q, p := range d.parked {
		if !time.Now().Before(p.retry) {
			ready = append(ready, q)
		}
	}
	d.mu.Unlock()
	for _, q := range ready {
		d.mu.Lock()
		p := d.parked[q]
		d.mu.Unlock()
		for {
			d.mu.Lock()
			if len(p.acts) == 0 {
				delete(d.parked, q)
				d.mu.Unlock()
				break
			}
			a := p.acts[0]
			stale := a.epoch != a.lv.epoch
			d.mu.Unlock()
			res := acted // stale: dropped, the level's next owner moves it
			if !stale {
				res = d.act(a, now)
			}
			if res == actFailed {
				d.mu.Lock()
				p.retry = time.Now().Add(retryAct)
				d.mu.Unlock()
				break
			}
			d.mu.Lock()
			p.acts[0] = nil
			p.acts = p.acts[1:]
			d.mu.Unlock()
			if !stale && res == acted {
				d.finish(a)
			}
			if d.ctx.Err() != nil {
				return time.Time{}, false
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.parked {
		if !ok || p.retry.Before(next) {
			next, ok = p.retry, true
		}
	}
	return next, ok
}

// retryAct is how long (on the system clock) a target that could not take
// an action waits before the next try.
const retryAct = 10 * time.Millisecond

// act delivers a when it is due by now (the time its turn was decided
// at: not a later reading, or it could jump the queue) or moves it down a
// level, and says what it did.
func (d *delayer) act(a *delayAction, now time.Time) int {
	if a.deliverAt.After(now) { // down a level (its tag is made anew)
		down := *a.msg
		down.Tag, down.DedupKey = a.tag, moveKey(a)
		_, err := d.placeAt(d.ctx, &placing{em: &down, target: a.target, at: a.deliverAt, inc: a.inc, now: now, own: true})
		if errors.Is(err, errDueNow) {
			// The clock passed its due time since now was read: it is
			// delivered in its due time's turn, not written to a level
			// (where nothing would keep a later one from going first).
			d.mu.Lock()
			a.at = a.deliverAt
			heap.Push(&d.due, a)
			d.mu.Unlock()
			d.signal()
			return requeued
		}
		if err != nil {
			return d.failed(a, err)
		}
		return acted
	}
	t, err := d.b.topic(a.target.Topic)
	if err != nil {
		if errors.Is(err, ErrTopicNotFound) {
			d.b.log.Error("ferry: delayed delivery: topic gone, dropping the message", "topic", a.target.Topic, "id", a.msg.ID.String())
			return acted
		}
		return d.failed(a, err)
	}
	if inc := a.inc; inc != 0 && t.meta.Incarnation != inc {
		// This broker's view of the topic may be behind: ask the storage.
		if nt, err := d.b.refresh(d.ctx, t); err == nil {
			t = nt
		} else if !errors.Is(err, ErrTopicNotFound) {
			return d.failed(a, err)
		}
		if t.meta.Incarnation != inc {
			d.b.log.Info("ferry: delayed delivery: topic deleted and created again since, dropping the message", "topic", a.target.Topic, "id", a.msg.ID.String())
			return acted
		}
	}
	q := t.queues[a.target.Queue%len(t.queues)]
	em := delivered(t, a.msg, a.tag, moveKey(a), a.deliverAt)
	if _, err := write(d.ctx, q, em, false, time.Time{}); err != nil {
		if errors.Is(err, ErrClosed) && d.ctx.Err() == nil {
			// Deleted, or created again, through another broker: the
			// next try sees what the storage holds.
			if _, rerr := d.b.refresh(d.ctx, t); errors.Is(rerr, ErrTopicNotFound) {
				d.b.log.Error("ferry: delayed delivery: topic gone, dropping the message", "topic", a.target.Topic, "id", a.msg.ID.String())
				return acted
			}
		}
		return d.failed(a, err)
	}
	return acted
}

// failed reports a failed action, to try again later.
func (d *delayer) failed(a *delayAction, err error) int {
	if d.ctx.Err() == nil && !errors.Is(err, ErrQueueFull) {
		d.b.log.Error("ferry: delayed delivery: move failed, trying again", "to", a.target.String(), "id", a.msg.ID.String(), "err", err)
	}
	return actFailed
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
