package ferrytest

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// Backend is one deployment of a backend for one subtest of
// [TestConsumers]: where brokers keep their messages and cursors and how
// their consumers coordinate. The suite closes Storage, Cursors (once, if
// it is the same value as Storage) and Coordinator when the subtest ends,
// after every broker it made over them.
type Backend struct {
	Storage ferry.Storage
	Cursors ferry.CursorStore
	// Coordinator, nil for the broker's own [ferry.MemoryCoordinator].
	Coordinator ferry.Coordinator
	// Reopen, when set, opens the same deployment again: the suite calls it
	// after it closed every broker over this Backend and the Backend
	// itself, and expects what was stored (messages, topics, cursors) in
	// the Backend it returns, which it closes in its turn. Nil for a
	// backend that keeps nothing across a close (memory): the subtests that
	// reopen then keep the one Backend open from round to round instead.
	Reopen func(t *testing.T) Backend
	// Expire, when set, makes the session of member in group g of
	// Coordinator (which must then be set) expire as if the member had
	// gone silent for the time to live, its leases lost: as
	// [CoordinatorFeatures].Expire, a [FakeCoordinator]'s Expire, say. It
	// may return before the expiry takes effect. With it, TestConsumers
	// checks what a lease loss does to a consumer (the LeaseLoss
	// subtest); without it, that subtest is skipped.
	Expire func(g ferry.GroupKey, member string)
}

func (b Backend) close() error {
	var errs []error
	if b.Storage != nil {
		errs = append(errs, b.Storage.Close())
	}
	if b.Cursors != nil && !sameCloser(b.Cursors, b.Storage) {
		errs = append(errs, b.Cursors.Close())
	}
	if b.Coordinator != nil && !sameCloser(b.Coordinator, b.Storage) && !sameCloser(b.Coordinator, b.Cursors) {
		errs = append(errs, b.Coordinator.Close())
	}
	return errors.Join(errs...)
}

// sameCloser reports whether a and b are the one value (comparing only
// comparable dynamic types).
func sameCloser(a, b any) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a != nil && b != nil && a == b
}

// BackendOpener returns a fresh, empty Backend for one subtest. It reports
// its own failures through t.
type BackendOpener func(t *testing.T) Backend

// ConsumerFeatures says how [TestConsumers] should treat a backend.
type ConsumerFeatures struct {
	// Scale multiplies the message counts of the subtests that send many
	// (a slow backend passes 0.1, say, rather than skip them); zero means
	// 1. Counts never go below a floor that still exercises the subtest.
	Scale float64
	// Timeout bounds each subtest (see the package doc on the watchdog)
	// and every wait in it. Zero means [DefaultTimeout].
	Timeout time.Duration
	// Known maps the names of subtests that fail on the backend for a
	// known defect of it to that defect: they are skipped with it as the
	// reason, unless the environment variable FERRY_KNOWN_DEFECTS is 1,
	// which runs them, to see whether the defect is still there.
	Known map[string]string
}

func (f ConsumerFeatures) scale(n, floor int) int {
	if f.Scale > 0 {
		n = int(float64(n) * f.Scale)
	}
	return max(n, floor)
}

// TestConsumers checks that push and pull consumers keep their contract
// over a backend: brokers over the Storage, CursorStore and Coordinator
// open returns (a fresh Backend for every subtest) deliver, commit,
// resume and rebalance as over memory. The subtests:
//
//   - ExactlyOnceStableGroup: three members split eight queues as
//     [ferry.AllocateAveragely] says, never a queue held twice, and
//     handle every message once; once split, no member loses a queue
//     and no commit is refused with [ferry.ErrFenced] (a fenced store
//     refuses only the commits of a lease that was lost).
//   - LeaseLoss (with [Backend].Expire): a member's session expires while
//     it is inside a handler; the handler is cancelled at once, the old
//     member handles and commits nothing more of the queue, the new owner
//     starts at the last commit before the loss with a larger token, and
//     over a [ferry.FencedCursorStore] a late commit of the old owner is
//     refused and moves nothing.
//   - ResumeFromCommittedCursor: a closed consumer's group resumes at its
//     committed cursor (only new messages); a closed consumer does not
//     start again.
//   - StartFromOnNewGroup: a new group starts at the earliest message, or
//     with [ferry.WithStartFrom](Latest) at the end.
//   - OrderedPerKeyOrder: two [ferry.Ordered] members handle each key's
//     messages in the order sent.
//   - Broadcast: every [ferry.Broadcast] member holds every queue and
//     handles every message once.
//   - BroadcastCursorsPerMember: a broadcast member's cursor is kept
//     under group@member; the same member resumes, a new one starts over.
//   - TagsFilterAndStillCommit: [ferry.WithTags] drops other tags and
//     commits past them.
//   - PullPollCommitResume: Poll and Commit; an uncommitted message holds
//     its queue's cursor and is polled again by the next member.
//   - PullMessagesAutoCommit: Messages with [ferry.WithAutoCommit]
//     commits what it yielded; a cancelled context ends it.
//   - PullAndPushShareAGroup: a pull and a push member split a group.
//   - Churn: members join and leave between produced batches; nothing is
//     lost and, every release draining fully, nothing handled twice over
//     a [ferry.HandoffCursorStore] (a revoke stops a taken batch, and only
//     the finished set tells the next owner which later messages
//     finished: over another store they are delivered again, which the
//     subtest logs).
//   - ChurnModel: a model-based churn test: members of a concurrent and
//     an ordered group join, leave, crash and restart at random while
//     handlers fail, panic, dead-letter and stall; a tracker checks, as
//     events happen and at the end of every round, that no two members
//     are inside one (group, queue), ordered handling, cursors never
//     moving back, no loss and every permanent failure dead-lettered.
//     With [Backend].Reopen it closes and reopens the Backend between
//     rounds (sometimes closing the broker with members live). The
//     environment variables FERRY_CHURN_SEED, FERRY_CHURN_ROUNDS and
//     FERRY_CHURN_DLQ_FAULTS replay a seed, set the rounds and turn the
//     injected dead-letter failures off.
func TestConsumers(t *testing.T, f ConsumerFeatures, open BackendOpener) {
	t.Helper()
	s := &consumerSuite{f: f, open: open}
	ff := Features{Timeout: f.Timeout}
	known := func(t *testing.T, name string) {
		if why, ok := f.Known[name]; ok && os.Getenv("FERRY_KNOWN_DEFECTS") != "1" {
			t.Skipf("known defect of the backend (FERRY_KNOWN_DEFECTS=1 runs it): %s", why)
		}
	}
	sub := func(name string, body func(e *env)) {
		run(t, ff, name, func(t *testing.T, w *watchdog) { known(t, name); body(s.env(t, w)) })
	}
	sub("ExactlyOnceStableGroup", s.exactlyOnce)
	sub("LeaseLoss", s.leaseLoss)
	sub("ResumeFromCommittedCursor", s.resume)
	sub("StartFromOnNewGroup", s.startFrom)
	sub("OrderedPerKeyOrder", s.ordered)
	sub("Broadcast", s.broadcast)
	sub("BroadcastCursorsPerMember", s.broadcastCursors)
	sub("TagsFilterAndStillCommit", s.tags)
	sub("PullPollCommitResume", s.pullPollCommit)
	sub("PullMessagesAutoCommit", s.pullMessages)
	sub("PullAndPushShareAGroup", s.pullAndPush)
	sub("Churn", s.churn)
	run(t, ff, "ChurnModel", func(t *testing.T, w *watchdog) { known(t, "ChurnModel"); s.churnModel(t, w) })
}

type consumerSuite struct {
	f    ConsumerFeatures
	open BackendOpener
}

// env is one subtest's backend and watchdog.
type env struct {
	t  *testing.T
	w  *watchdog
	f  ConsumerFeatures
	be Backend
}

func (s *consumerSuite) env(t *testing.T, w *watchdog) *env {
	be := s.open(t)
	t.Cleanup(func() {
		if err := be.close(); err != nil {
			t.Errorf("ferrytest: close backend: %v", err)
		}
	})
	return &env{t: t, w: w, f: s.f, be: be}
}

// newTopic returns a broker over the backend holding topic "t" with n
// queues, closed when the subtest ends (before the backend).
func (e *env) newTopic(n int) *ferry.Broker {
	e.t.Helper()
	b := NewBroker(e.t, ferry.WithStorage(e.be.Storage), ferry.WithCursorStore(e.be.Cursors), ferry.WithCoordinator(e.be.Coordinator))
	must(e.t, b.CreateTopic(e.w.ctx, ferry.TopicMeta{Name: "t", Queues: n}), "create topic")
	return b
}
