package ferrytest

import (
	"context"
	"errors"

	"github.com/ferrymq/ferry"
)

// The churn's steps: what happens to the group between rounds.

// step makes one random membership change, or none.
func (c *churn) step() {
	switch a := c.rng.IntN(12); {
	case a < 3:
		g := c.pickGroup()
		if c.count(g) >= churnMax {
			c.closeMember(c.pick(g, nil), false)
			return
		}
		pull := g == "conc" && c.rng.IntN(2) == 0
		c.join(g, pull, !pull && c.rng.IntN(2) == 0)
	case a < 5:
		if m := c.pick("", nil); m != nil {
			c.closeMember(m, false)
		}
	case a < 7:
		m := c.pick("", func(m *churnMember) bool { return m.fragile || m.pull })
		if m == nil {
			c.join(c.pickGroup(), false, true)
			return
		}
		c.closeMember(m, true)
	case a < 8:
		if m := c.pick("", nil); m != nil {
			c.closeMember(m, false)
			c.start(m.group, m.id, m.pull, m.fragile, m.opts, m.pullOpts)
		}
	case a < 9:
		c.pauseStep()
	case a < 10:
		c.loseStep()
	case a < 11:
		c.growStep()
	default:
		c.seekStep()
	}
}

// seekStep seeks a queue a push member holds back to its group's last
// committed cursor: what finished after it is handled again (at least
// once), in order for the ordered groups, and the seek's commit is the
// one allowed to move the cursor back.
func (c *churn) seekStep() {
	m := c.pick("", func(m *churnMember) bool { return !m.pull })
	if m == nil {
		return
	}
	held := m.push.Assigned()
	if len(held) == 0 {
		return
	}
	q := held[c.rng.IntN(len(held))].Queue
	to := c.tr.cursor(m.group, q)
	if to < 0 {
		return
	}
	c.tr.seeking(m.group, q, to)
	err := c.bounded("seek", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), churnWatchdog)
		defer cancel()
		return m.push.Seek(ctx, ferry.ResetToOffsets(map[int]int64{q: to}))
	})
	switch {
	case err == nil:
		c.seeks++
	case errors.Is(err, ferry.ErrInvalidOption):
		c.tr.seeking(m.group, q, -1) // the queue moved before the seek
	case errors.Is(err, ferry.ErrClosed):
		// Given up while seeking (a rebalance): the seek's commit may
		// have landed, and stays excused.
	default:
		c.fatal("seek %s queue %d to %d: %v", m.id, q, to, err)
	}
}

// growStep adds a queue to the topic (now and then, up to three): the
// members rebalance over it, keys hash anew, and the retry topic keeps
// its count.
func (c *churn) growStep() {
	if c.queues >= churnQueues+3 || c.rng.IntN(3) != 0 {
		return
	}
	c.tr.grow(c.queues + 1) // before the first message routed to it
	if err := c.b.AddQueues(context.Background(), churnTopic, c.queues+1); err != nil {
		c.fatal("AddQueues to %d: %v", c.queues+1, err)
	}
	c.queues++
	c.grows++
}

// pauseStep pauses one queue of a member, or resumes every queue of a
// paused one: a paused queue stays owned and nothing of it is taken, so
// the group waits for it (settle resumes every member).
func (c *churn) pauseStep() {
	m := c.pick("", nil)
	if m == nil {
		return
	}
	if len(m.paused()) > 0 || c.rng.IntN(3) == 0 {
		c.resume(m)
		return
	}
	q := ferry.QueueID{Topic: churnTopic, Queue: c.rng.IntN(c.queues)}
	var err error
	if m.pull {
		err = m.pc.Pause(q)
	} else {
		err = m.push.Pause(q)
	}
	if err != nil {
		c.fatal("pause %s of %s: %v", q, m.id, err)
	}
	c.pauses++
}

// resume resumes every queue of m.
func (c *churn) resume(m *churnMember) {
	var err error
	if m.pull {
		err = m.pc.Resume()
	} else {
		err = m.push.Resume()
	}
	if err != nil {
		c.fatal("resume %s: %v", m.id, err)
	}
}

// paused returns the queues m holds paused.
func (m *churnMember) paused() []ferry.QueueID {
	if m.pull {
		return m.pc.Paused()
	}
	return m.push.Paused()
}

// loseStep expires a member's session in the coordinator, as if it had
// gone silent for its time to live: its leases are lost while its
// handlers may be busy, its queues go to the others, and it joins again.
// Nothing over a Backend without Expire.
func (c *churn) loseStep() {
	if c.be.Expire == nil {
		return
	}
	if m := c.pick("", nil); m != nil {
		// Expire first: from then on the member admits nothing on the
		// lost queues (its leases' deadlines passed), so the calls it is
		// inside when marked are those it started before.
		c.be.Expire(ferry.GroupKey{Scope: m.group, Topic: churnTopic}, m.id)
		c.tr.expireMember(m.group, m.id)
		c.losses++
	}
}

func (c *churn) pickGroup() string {
	switch c.rng.IntN(3) {
	case 0:
		return "conc"
	case 1:
		return "ord"
	}
	return churnKeyed
}

func (c *churn) count(group string) int {
	n := 0
	for _, m := range c.members {
		if m.group == group {
			n++
		}
	}
	return n
}

// pick returns a random live member of group ("" for any) that ok
// accepts (nil for any), or nil.
func (c *churn) pick(group string, ok func(*churnMember) bool) *churnMember {
	var from []*churnMember
	for _, m := range c.members {
		if (group == "" || m.group == group) && (ok == nil || ok(m)) {
			from = append(from, m)
		}
	}
	if len(from) == 0 {
		return nil
	}
	return from[c.rng.IntN(len(from))]
}
