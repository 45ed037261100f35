package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferry"
)

// The churn's members: joining, handling, closing, and the checks at the
// end of a round.

// join starts a new member of group.
func (c *churn) join(group string, pull, fragile bool) {
	c.seq++
	kind := "push"
	if pull {
		kind = "pull"
	}
	if fragile {
		kind += "f"
	}
	id := fmt.Sprintf("%s-%s-%d", group, kind, c.seq)
	shared := []ferry.GroupOption{
		ferry.WithMemberID(id),
		ferry.WithBuffer(8+c.rng.IntN(64), 1<<20),
		ferry.WithOnReset(func(q ferry.QueueID, from, to int64) { c.tr.reset(group, q, from, to) }),
	}
	if pull {
		var opts []ferry.PullConsumerOption
		for _, o := range shared {
			opts = append(opts, o)
		}
		c.start(group, id, pull, fragile, nil, opts)
		return
	}
	var opts []ferry.ConsumerOption
	for _, o := range shared {
		opts = append(opts, o)
	}
	workers := 1 + c.rng.IntN(4)
	c.tr.setWorkers(id, workers)
	opts = append(opts, ferry.WithConcurrency(workers),
		ferry.WithRetry(4, 200*time.Microsecond), ferry.WithMaxRetryBackoff(time.Millisecond))
	switch {
	case churnGroups[group]:
		opts = append(opts, ferry.Ordered())
	case group == churnKeyed:
		opts = append(opts, ferry.OrderedByKey())
	}
	if fragile {
		opts = append(opts, ferry.WithDrainTimeout(time.Millisecond))
	}
	c.start(group, id, pull, fragile, opts, nil)
}

// start makes and starts a member with opts (push) or pullOpts (pull); a
// pull member starts through its first Poll, in its loop.
func (c *churn) start(group, id string, pull, fragile bool, opts []ferry.ConsumerOption, pullOpts []ferry.PullConsumerOption) {
	m := &churnMember{id: id, group: group, pull: pull, fragile: fragile, opts: opts, pullOpts: pullOpts,
		poll: []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}[c.rng.IntN(3)]}
	var err error
	if pull {
		m.pc, err = c.b.NewPullConsumer(group, churnTopic, pullOpts...)
		must(c.t, err, "new pull consumer")
		ctx, cancel := context.WithCancel(context.Background())
		m.stopLoop, m.loopDone = cancel, make(chan struct{})
		go c.pullLoop(ctx, m)
	} else {
		m.push, err = c.b.NewConsumer(group, churnTopic, c.handler(group), opts...)
		must(c.t, err, "new consumer")
		ctx, cancel := context.WithTimeout(context.Background(), churnWatchdog)
		err = m.push.Start(ctx)
		cancel()
		if err != nil {
			c.fatal("watchdog: Start of member %s in group %s: %v", id, group, err)
		}
	}
	c.members = append(c.members, m)
}

// handler is a push member's handler for group: it does what each
// message's fate says and tells the tracker.
func (c *churn) handler(group string) ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) (err error) {
		d, _ := ferry.DeliveryFrom(ctx)
		_, retry := m.Headers[ferry.HeaderAttempts] // from the group's retry topic
		call := c.tr.enter(group, d.Member, m.Queue, m.Offset, string(m.Body), d.Attempt, retry, ctx.Done())
		out := outPanic // unless the handler returns
		defer func() { c.tr.exit(call, out) }()
		f, work := fateOf(c.seed, bodyID(m.Body))
		switch {
		case f == fateSlow:
			t := time.NewTimer(work)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				out = outFail
				return ctx.Err()
			}
		case f == fateStubborn:
			<-time.After(work) // ignores ctx
		case f == fateTransient && d.Attempt == 1:
			out = outFail
			return errors.New("churn: transient")
		case f == fatePanic && d.Attempt == 1:
			panic("churn: handler panic")
		case f == fatePermanent || f == fatePermanentDLQFail:
			out = outPermanent
			return ferry.Permanent(errors.New("churn: permanent"))
		}
		out = outOK
		return nil
	})
}

// pullLoop polls with a short timeout, records each message as handled by
// m and commits it, until ctx is done or the consumer is closed.
func (c *churn) pullLoop(ctx context.Context, m *churnMember) {
	defer close(m.loopDone)
	timedOut := false
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, m.poll)
		msgs, err := m.pc.Poll(pctx, 8)
		cancel()
		switch {
		case errors.Is(err, ferry.ErrClosed):
			if !m.closing.Load() {
				c.tr.violate(violSelfClose, "pull member %s of group %s: Poll returned %v though the test never closed it (an earlier Poll timed out: %v)",
					m.id, m.group, err, timedOut)
			}
			return
		case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			timedOut = true
			continue
		case err != nil:
			continue
		}
		calls := make([]*call, len(msgs))
		for i, msg := range msgs {
			calls[i] = c.tr.enter(m.group, m.id, msg.Queue, msg.Offset, string(msg.Body), 1, false, nil)
		}
		// The handling is over once Commit is called: the commit can
		// let the queue go to the next owner before Commit returns.
		for _, cl := range calls {
			c.tr.handingBack(cl)
		}
		err = m.pc.Commit(context.Background(), msgs...)
		out := outOK
		if err != nil {
			out = outFail
		}
		for _, cl := range calls {
			c.tr.exit(cl, out)
		}
		if errors.Is(err, ferry.ErrClosed) && !m.closing.Load() {
			c.tr.violate(violSelfClose, "pull member %s of group %s: Commit returned %v though the test never closed it", m.id, m.group, err)
		}
	}
}

// closeMember closes m: gracefully (a pull member's loop stops first, so
// everything it polled is committed), or as a crash (a fragile push
// member, its handlers busy if they get busy soon, drains for 1ms; a pull
// member is closed under its running loop, abandoning what it polled).
func (c *churn) closeMember(m *churnMember, crash bool) {
	c.members = slices.DeleteFunc(c.members, func(x *churnMember) bool { return x == m })
	m.closing.Store(true)
	switch {
	case m.pull && crash:
		c.tr.abandonMember(m.group, m.id)
		c.tr.crashed(fmt.Sprintf("%s holding %v", m.id, m.pc.Assigned()))
		_ = c.bounded("Close of pull member "+m.id, m.pc.Close)
		c.bounded("the poll loop of "+m.id, func() error { m.stopLoop(); <-m.loopDone; return nil })
	case m.pull:
		c.bounded("the poll loop of "+m.id, func() error { m.stopLoop(); <-m.loopDone; return nil })
		_ = c.bounded("Close of pull member "+m.id, m.pc.Close)
	default:
		if crash {
			c.waitBusy(m, 50*time.Millisecond)
			c.tr.crashed(fmt.Sprintf("%s holding %v, %d calls inside", m.id, m.push.Assigned(), c.tr.busy(m.group, m.id)))
		}
		_ = c.bounded("Close of member "+m.id, m.push.Close)
	}
}

// waitBusy waits until m is inside the handler, or for at most d.
func (c *churn) waitBusy(m *churnMember, d time.Duration) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		ch := c.tr.changes()
		if c.tr.busy(m.group, m.id) > 0 {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			return
		}
	}
}

// settle makes sure both groups have a push member, then waits until every
// produced offset is finished and every cursor is at its queue's end, and
// checks the end-of-round invariants. It reports false after recording a
// stall: nothing changed for stallTimeout (or the watchdog passed) while
// something was missing; the round then ends without the end checks, and
// the next round's members must pick the work up.
func (c *churn) settle(round int) bool {
	for _, m := range c.members {
		c.resume(m)
	}
	for g := range churnGroups {
		if c.pick(g, func(m *churnMember) bool { return !m.pull }) == nil {
			c.join(g, false, false)
		}
	}
	deadline := time.NewTimer(churnWatchdog)
	defer deadline.Stop()
	quiet := time.NewTimer(stallTimeout)
	defer quiet.Stop()
	for {
		ch := c.tr.changes()
		ok, missing := c.tr.settled()
		if ok {
			break
		}
		select {
		case <-ch:
			quiet.Reset(stallTimeout)
			c.w.progress()
			continue
		case <-quiet.C:
		case <-deadline.C:
		}
		var assigned []string
		for _, m := range c.members {
			if m.pull {
				assigned = append(assigned, fmt.Sprintf("%s%v", m.id, m.pc.Assigned()))
			} else {
				assigned = append(assigned, fmt.Sprintf("%s%v", m.id, m.push.Assigned()))
			}
		}
		c.tr.violate(violStall, "round %d did not settle (nothing changed for %v, or %v passed): %s\nmembers: %v\ntracker:\n%s",
			round, stallTimeout, churnWatchdog, missing, assigned, c.tr.dump())
		return false
	}
	c.readDeadLetters()
	c.tr.checkEnd()
	return true
}

// readDeadLetters reads every dead-letter topic back.
func (c *churn) readDeadLetters() {
	ctx, cancel := context.WithTimeout(context.Background(), churnWatchdog)
	defer cancel()
	for g := range churnGroups {
		name, err := ferry.DeadLetterTopic(g)
		must(c.t, err, "dead-letter topic")
		q, err := c.b.Queue(name, 0)
		if errors.Is(err, ferry.ErrTopicNotFound) {
			continue // the consumers make it with their first dead letter, or at Start
		}
		must(c.t, err, "dead-letter queue")
		oldest, next := q.Offsets()
		buf := make([]*ferry.EnhancedMessage, 64)
		for off := oldest; off < next; {
			n, err := q.Read(ctx, off, buf)
			if err != nil {
				c.fatal("read back %%DLQ%%%s at %d: %v", g, off, err)
			}
			for _, m := range buf[:n] {
				c.tr.dlqRead(m)
			}
			off = buf[n-1].Offset + 1
		}
	}
}

// checkCursorsAtEnd checks, with every member closed after the round
// settled, that each group's stored cursor is at its queue's end.
func (c *churn) checkCursorsAtEnd(round int) {
	cursors := c.be.Cursors
	for g := range churnGroups {
		offs, err := cursors.Load(context.Background(), churnTopic, g, c.queues)
		must(c.t, err, "load cursors")
		for q, off := range offs {
			if next := c.tr.next(q); off != next {
				c.tr.violate(violCursorEnd, "round %d: group %s queue %d: cursor %d once every member closed, want the end %d", round, g, q, off, next)
			}
		}
	}
}

// closeBrokerLive closes the broker with its members live, then stops the
// poll loops.
func (c *churn) closeBrokerLive() {
	for _, m := range c.members {
		m.closing.Store(true)
		c.tr.crashed(m.id + " by Broker.Close")
	}
	c.closeBroker()
	for _, m := range c.members {
		if m.pull {
			c.bounded("the poll loop of "+m.id, func() error { m.stopLoop(); <-m.loopDone; return nil })
			_ = c.bounded("Close of pull member "+m.id, m.pc.Close)
		} else {
			_ = c.bounded("Close of member "+m.id, m.push.Close)
		}
	}
	c.members = nil
}

func (c *churn) closeBroker() {
	if c.p != nil {
		must(c.t, c.p.Close(), "close producer")
		c.p = nil
	}
	if c.b != nil {
		b := c.b
		c.b = nil
		must(c.t, c.bounded("Broker.Close", b.Close), "Broker.Close")
	}
}

func (c *churn) closeStore() {
	if c.isOpen {
		c.isOpen = false
		must(c.t, c.be.close(), "close the backend")
	}
}

// closeAll is the cleanup after a failure: it closes what is still open,
// each close bounded, without failing again.
func (c *churn) closeAll() {
	wait := func(f func()) {
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		select {
		case <-done:
		case <-time.After(churnWatchdog):
			c.t.Errorf("watchdog: cleanup did not finish within %v", churnWatchdog)
		}
	}
	for _, m := range c.members {
		m.closing.Store(true)
		if m.pull {
			wait(func() { m.stopLoop(); <-m.loopDone; _ = m.pc.Close() })
		} else {
			wait(func() { _ = m.push.Close() })
		}
	}
	c.members = nil
	if c.p != nil {
		_ = c.p.Close()
	}
	if c.b != nil {
		wait(func() { _ = c.b.Close() })
	}
	if c.isOpen {
		c.isOpen = false
		wait(func() { _ = c.be.close() })
	}
}
