package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// churnModel is the model-based churn test of [TestConsumers]. Members of two groups on one
// topic — "conc" (push consumers, concurrent, beside pull consumers) and
// "ord" (push consumers, Ordered) — join, leave, crash-close and restart
// at random while a producer sends keyed batches; handlers fail
// transiently (the first attempt of some offsets), permanently
// (ferry.Permanent), panic (first attempt) or take a while (some ignoring
// their context), and the first dead-letter write of some permanent
// failures fails. Over a Backend with Reopen (filestore, natsstore)
// it closes everything and reopens the Backend between rounds (after a
// graceful close, or a Broker.Close with members live); over one without
// (memory) it keeps the one Backend and broker from round to round.
//
// A tracker (churn_tracker.go) wraps the handlers, the CursorStore
// and the dead-letter queues and checks, as events happen:
//   - overlap: no member enters a (group, queue) while another member is
//     inside it, unless the consumer gave that call up (its context was
//     cancelled by a drain timeout while it ran, or the test crash-closed
//     the pull member holding it);
//   - stale-call: no handler call starts with its context already
//     cancelled (the queue was given up: work must not start then). A
//     worker admits each call by checking that the queue was not given
//     up, and the give-up can land between that check and the handler's
//     first instruction, so each worker of the member may show one such
//     call per queue given up; a second one of the same (member, queue)
//     beyond the member's worker count is the defect (the rest of a
//     batch handled after the give-up);
//   - order (group "ord"): no offset is entered before every lower offset
//     of its queue finished (handled, or dead-lettered); calls of the same
//     offset again are fine. No drain-timeout excuse is needed here: the
//     next owner starts at the committed cursor, at or below any offset the
//     old owner abandoned, and a stale call of the old owner is an overlap;
//   - cursor-backwards: a committed cursor never moves back (no reset is
//     reported, and with default retention none may be: "reset");
//   - self-closed: a pull consumer stays open until the test closes it;
//   - unfenced-commit: over a [ferry.FencedCursorStore], every commit of
//     the consumers reaches the store through CommitFenced, with its
//     token (the tracker's own wrapper of the store keeps it).
//
// At the end of every round it waits (bounded by a watchdog that fails
// with a dump of the tracker) until every produced offset is finished for
// both groups and every cursor is at its queue's end, reads the
// dead-letter topics back and checks: no loss (every offset handled
// successfully or in the dead-letter topic), every Permanent failure in
// the dead-letter topic, handled bodies as produced, and, once every
// member is closed, cursors at the end. Violations are reported per round.
//
// FERRY_CHURN_SEED replays a seed (logged); FERRY_CHURN_ROUNDS sets the
// rounds (default 5, scaled by [ConsumerFeatures].Scale, at least 2);
// FERRY_CHURN_DLQ_FAULTS=0 turns the injected dead-letter write failures
// off, to look at the other invariants alone. Scheduling still varies
// between runs of a seed; the choices of the test do not. The leak check
// is the test binary's (goleak in each package's TestMain).
func (s *consumerSuite) churnModel(t *testing.T, w *watchdog) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FERRY_CHURN_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		must(t, err, "FERRY_CHURN_SEED")
		seed = n
	}
	rounds := s.f.scale(5, 2)
	if v := os.Getenv("FERRY_CHURN_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		must(t, err, "FERRY_CHURN_ROUNDS")
		if n < 1 {
			t.Fatalf("FERRY_CHURN_ROUNDS=%d: want at least 1", n)
		}
		rounds = n
	}
	dlqFaults := os.Getenv("FERRY_CHURN_DLQ_FAULTS") != "0"
	t.Logf("seed %d, %d rounds, dead-letter write faults %v (replay: FERRY_CHURN_SEED=%d)", seed, rounds, dlqFaults, seed)
	c := newChurn(t, w, s.open(t), seed, 0)
	c.dlqFaults = dlqFaults
	c.run(rounds)
}

const (
	churnTopic    = "churn"
	churnQueues   = 6
	churnKeys     = 24
	churnSteps    = 40 // churn steps per round
	churnMax      = 4  // members per group at most
	churnWatchdog = 10 * time.Second
	stallTimeout  = 3 * time.Second // no progress for this long while unsettled is a stall
)

// churnGroups maps each group to whether it is ordered.
var churnGroups = map[string]bool{"conc": false, "ord": true}

// fate is what the handler does with a message, by its unique id.
type fate int

const (
	fateOK fate = iota
	fateSlow
	fateStubborn  // slow, ignoring its context
	fateTransient // an error on the first attempt
	fatePanic     // a panic on the first attempt
	fatePermanent
	fatePermanentDLQFail // permanent, and the first dead-letter write fails
)

func fateOf(seed, id uint64) (fate, time.Duration) {
	h := mix64(seed ^ mix64(id))
	work := time.Duration(200+h>>40%1800) * time.Microsecond
	switch p := h % 100; {
	case p < 3:
		return fatePermanent, 0
	case p < 5:
		return fatePermanentDLQFail, 0
	case p < 12:
		return fateTransient, 0
	case p < 15:
		return fatePanic, 0
	case p < 25:
		return fateSlow, work
	case p < 28:
		return fateStubborn, work
	}
	return fateOK, 0
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func bodyID(body []byte) uint64 {
	id, _ := strconv.ParseUint(string(body[1:]), 10, 64)
	return id
}

type churnMember struct {
	id, group string
	pull      bool
	fragile   bool                       // a tiny drain timeout: Close while busy is a crash
	opts      []ferry.ConsumerOption     // a push member's
	pullOpts  []ferry.PullConsumerOption // a pull member's
	push      *ferry.Consumer
	pc        *ferry.PullConsumer
	closing   atomic.Bool
	poll      time.Duration // a pull member's Poll timeout
	stopLoop  context.CancelFunc
	loopDone  chan struct{}
}

type churn struct {
	t    *testing.T
	w    *watchdog
	seed uint64
	// be is the Backend; open tells whether it is open. With be.Reopen
	// (persistent) it is closed and reopened between rounds.
	be         Backend
	isOpen     bool
	persistent bool
	rng        *rand.Rand
	// dlqFaults makes the first dead-letter write of the
	// fatePermanentDLQFail messages fail (FERRY_CHURN_DLQ_FAULTS=0: none).
	dlqFaults bool
	tr        *tracker

	b       *ferry.Broker
	p       *ferry.Producer
	members []*churnMember
	seq     int
	nextID  uint64
}

func newChurn(t *testing.T, w *watchdog, be Backend, seed, stream uint64) *churn {
	c := &churn{
		t: t, w: w, seed: seed, be: be, isOpen: true, persistent: be.Reopen != nil,
		rng: rand.New(rand.NewPCG(seed, stream)),
		tr:  newTracker(churnQueues, churnGroups),
	}
	t.Cleanup(c.closeAll)
	return c
}

// fatal fails the test with a dump of the tracker.
func (c *churn) fatal(format string, args ...any) {
	c.t.Helper()
	viol, _ := c.tr.take()
	c.t.Fatalf("%s\nseed %d (FERRY_CHURN_SEED=%d)\nviolations:\n%stracker:\n%s", fmt.Sprintf(format, args...), c.seed, c.seed, viol, c.tr.dump())
}

// bounded runs f, failing the test if it does not return within the
// watchdog.
func (c *churn) bounded(what string, f func() error) error {
	c.t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(churnWatchdog):
		c.fatal("watchdog: %s did not return within %v", what, churnWatchdog)
		return nil
	}
}

func (c *churn) run(rounds int) {
	for round := range rounds {
		last := round == rounds-1
		if c.b == nil {
			c.open()
		}
		c.join("conc", false, false)
		c.join("ord", false, false)
		for range churnSteps {
			c.produce(1 + c.rng.IntN(20))
			c.step()
		}
		switch {
		case c.persistent && !last && c.rng.IntN(3) == 0:
			// Crash the broker: every member is live, handlers may be busy,
			// nothing is waited for. The next round must finish the job.
			c.t.Logf("round %d: Broker.Close with %d members live", round, len(c.members))
			c.closeBrokerLive()
			c.closeStore()
		case !c.persistent && last:
			c.settle(round)
			c.t.Logf("round %d: Broker.Close with %d members live", round, len(c.members))
			c.closeBrokerLive()
			c.closeStore()
		default:
			settled := c.settle(round)
			for len(c.members) > 0 {
				c.closeMember(c.members[0], false)
			}
			if settled {
				c.checkCursorsAtEnd(round)
			}
			if c.persistent || last {
				c.closeBroker()
				c.closeStore()
			}
		}
		if viol, n := c.tr.take(); n > 0 {
			c.t.Errorf("round %d (seed %d, FERRY_CHURN_SEED=%d): %d invariant violations (first of each kind):\n%s",
				round, c.seed, c.seed, n, viol)
		}
		c.w.progress()
	}
	c.t.Logf("reopen %v: %d messages, violations: %s", c.persistent, c.nextID, c.tr.summary())
}

// open opens the Backend again if it was closed, a broker over it
// and a producer, and checks what the store kept.
func (c *churn) open() {
	t := c.t
	if !c.isOpen {
		c.be, c.isOpen = c.be.Reopen(t), true
	}
	storage, cursors := c.be.Storage, c.be.Cursors
	failOf := func(body []byte) bool {
		f, _ := fateOf(c.seed, bodyID(body))
		return c.dlqFaults && f == fatePermanentDLQFail
	}
	b, err := ferry.NewBroker(
		ferry.WithStorage(&trackedStorage{Storage: storage, tr: c.tr, failOf: failOf}),
		ferry.WithCursorStore(newTrackedCursors(fenceProbe(cursors, c.tr), c.tr)),
		ferry.WithCoordinator(c.be.Coordinator),
		ferry.WithLogger(slog.New(trackLog{c.tr})))
	must(t, err, "new broker")
	c.b = b
	ctx := context.Background()
	must(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: churnTopic, Queues: churnQueues}), "create topic")
	for g := range churnGroups {
		// The consumers would create them on first use; the test reads
		// them back.
		must(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "%DLQ%" + g, Queues: 1}), "create dead-letter topic")
	}
	c.p, err = b.NewProducer()
	must(t, err, "new producer")

	for q := range churnQueues {
		rq, err := b.Queue(churnTopic, q)
		must(t, err, "queue")
		if _, next := rq.Offsets(); next != c.tr.next(q) {
			c.tr.violate(violReopen, "queue %d: next offset %d after reopen, %d produced", q, next, c.tr.next(q))
		}
	}
	for g := range churnGroups {
		offs, err := cursors.Load(ctx, churnTopic, g, churnQueues)
		must(t, err, "load cursors")
		for q, off := range offs {
			if want := c.tr.cursor(g, q); off != want {
				c.tr.violate(violReopen, "group %s queue %d: cursor %d after reopen, %d last committed", g, q, off, want)
			}
		}
	}
}

// produce sends n keyed messages in one batch.
func (c *churn) produce(n int) {
	msgs := make([]*ferry.Message, n)
	bodies := make([]string, n)
	for i := range msgs {
		id := c.nextID
		c.nextID++
		bodies[i] = "u" + strconv.FormatUint(id, 10)
		msgs[i] = &ferry.Message{Topic: churnTopic, Key: "k" + strconv.FormatUint(id%churnKeys, 10), Body: []byte(bodies[i])}
	}
	ctx, cancel := context.WithTimeout(context.Background(), churnWatchdog)
	defer cancel()
	res, err := c.p.SendBatch(ctx, msgs)
	if err != nil {
		c.fatal("SendBatch of %d: %v", n, err)
	}
	c.tr.produce(bodies, res)
}

// step makes one random membership change, or none.
func (c *churn) step() {
	switch a := c.rng.IntN(10); {
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
	}
}

func (c *churn) pickGroup() string {
	if c.rng.IntN(2) == 0 {
		return "conc"
	}
	return "ord"
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
	if churnGroups[group] {
		opts = append(opts, ferry.Ordered())
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
		q, err := c.b.Queue("%DLQ%"+g, 0)
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
		offs, err := cursors.Load(context.Background(), churnTopic, g, churnQueues)
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
