package ferrytest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// churnModel is the model-based churn test of [TestConsumers]. Members of two groups on one
// topic — "conc" (push consumers, concurrent, beside pull consumers) and
// "ord" (push consumers, Ordered) — and a third, "key" (push consumers,
// OrderedByKey) — join, leave, crash-close and restart
// at random, pause and resume queues, and (over a Backend with Expire)
// lose their leases with their sessions, the topic gains queues
// (AddQueues), and members seek queues back to their committed cursor,
// while a producer sends keyed batches; handlers fail
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
//     offset again are fine. Group "key": the same per key (a queue's
//     lower offsets of the entering message's key). No drain-timeout excuse is needed here: the
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

// churnGroups maps each group to whether it is ordered (per queue).
var churnGroups = map[string]bool{"conc": false, "ord": true, "key": false}

// churnKeyed is the group ordered by key (ferry.OrderedByKey).
const churnKeyed = "key"

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
	// queues is the topic's queue count, grown by AddQueues steps.
	queues int
	// pauses, losses and grows count the Pause, Expire and AddQueues
	// steps made.
	pauses, losses, grows, seeks int
}

func newChurn(t *testing.T, w *watchdog, be Backend, seed, stream uint64) *churn {
	c := &churn{
		t: t, w: w, seed: seed, be: be, isOpen: true, persistent: be.Reopen != nil,
		rng: rand.New(rand.NewPCG(seed, stream)),
		tr:  newTracker(churnQueues, churnGroups), queues: churnQueues,
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
		c.join(churnKeyed, false, false)
		for range churnSteps {
			c.produce(1 + c.rng.IntN(20))
			c.step()
			c.w.progress() // a step is progress: a round over a slow coordinator may take long
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
	c.t.Logf("reopen %v: %d messages, %d pauses, %d sessions expired, %d queues added, %d seeks, violations: %s", c.persistent, c.nextID, c.pauses, c.losses, c.grows, c.seeks, c.tr.summary())
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
	must(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: churnTopic, Queues: c.queues}), "create topic")
	c.p, err = b.NewProducer()
	must(t, err, "new producer")

	for q := range c.queues {
		rq, err := b.Queue(churnTopic, q)
		must(t, err, "queue")
		if _, next := rq.Offsets(); next != c.tr.next(q) {
			c.tr.violate(violReopen, "queue %d: next offset %d after reopen, %d produced", q, next, c.tr.next(q))
		}
	}
	for g := range churnGroups {
		offs, err := cursors.Load(ctx, churnTopic, g, c.queues)
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
