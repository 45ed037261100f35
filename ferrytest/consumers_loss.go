package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
)

// lossBound bounds how long the old member's handler may run on,
// uncancelled, after its session expired: a watchdog (a correct member
// cancels it as soon as Lost is closed), not a performance bound.
const lossBound = 5 * time.Second

// commitRec is a commit seen by leaseLoss's wrappers.
type commitRec struct {
	commitCall
	err   error
	after bool // made after the new owner's first accepted commit
}

// commitLog records the commits of (topic "t", group "g", queue 0) that
// one broker makes.
type commitLog struct {
	mu    sync.Mutex // guards recs and first
	recs  []commitRec
	first chan struct{} // closed at the first accepted commit (the new owner's log only)
	once  sync.Once
}

func (l *commitLog) wrap(s ferry.CursorStore, other *commitLog) ferry.CursorStore {
	return wrapCursors(s, func(c commitCall, commit func() error) error {
		if c.topic != "t" || c.group != "g" || c.queue != 0 {
			return commit()
		}
		after := other != nil && isClosed(other.first)
		err := commit()
		l.mu.Lock()
		l.recs = append(l.recs, commitRec{commitCall: c, err: err, after: after})
		l.mu.Unlock()
		if err == nil && l.first != nil {
			l.once.Do(func() { close(l.first) })
		}
		return err
	})
}

func (l *commitLog) records() []commitRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recs)
}

// leaseLoss: a member loses its lease (its session expires, through
// [Backend].Expire) while inside a handler; its handler is cancelled, it
// handles and commits nothing more of the queue, the next owner starts
// at the last commit, with a larger token, and a late commit of the old
// owner is refused (over a [ferry.FencedCursorStore]).
func (s *consumerSuite) leaseLoss(e *env) {
	t := e.t
	if e.be.Expire == nil {
		t.Skip("ferrytest: Backend.Expire not set: cannot lose a lease")
	}
	if e.be.Coordinator == nil {
		t.Fatal("ferrytest: Backend.Expire is set but Backend.Coordinator is nil: the brokers' own memory coordinators cannot expire a session")
	}
	ctx := e.w.ctx
	g := ferry.GroupKey{Scope: "g", Topic: "t"}
	// The queue is m-old's until the test says it is lost, then m-new's:
	// after the expiry, m-old joins again and gets nothing.
	var lost atomic.Bool
	alloc := ferry.AllocatorFunc(func(_, self string, qs []ferry.QueueID, _ []string) []ferry.QueueID {
		if (self == "m-old") != lost.Load() {
			return slices.Clone(qs)
		}
		return nil
	})
	oldLog, newLog := &commitLog{}, &commitLog{first: make(chan struct{})}
	newBroker := func(cursors ferry.CursorStore) *ferry.Broker {
		b := NewBroker(t, ferry.WithStorage(e.be.Storage), ferry.WithCursorStore(cursors), ferry.WithCoordinator(e.be.Coordinator))
		must(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}), "create topic")
		return b
	}
	b1 := newBroker(oldLog.wrap(e.be.Cursors, newLog))
	b2 := newBroker(newLog.wrap(e.be.Cursors, nil))

	var (
		mu         sync.Mutex
		oldAfter   []string // what m-old started handling after its handler was cancelled
		newFirst   = int64(-1)
		blockOnce  sync.Once
		cancelOnce sync.Once
	)
	blocked, cancelled := make(chan struct{}), make(chan struct{})
	unblock := make(chan struct{}) // closed when the subtest ends, before the consumers close
	newTally := NewTally(11)
	h := ferry.HandlerFunc(func(hctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(hctx)
		_, retry := m.Headers[ferry.HeaderAttempts]
		body := string(m.Body)
		if d.Member == "m-old" {
			if isClosed(cancelled) && !retry {
				mu.Lock()
				oldAfter = append(oldAfter, fmt.Sprintf("%s (offset %d, attempt %d)", body, m.Offset, d.Attempt))
				mu.Unlock()
			}
			first := false
			if body == "blk0" {
				blockOnce.Do(func() { first = true })
			}
			if first {
				close(blocked)
				select {
				case <-hctx.Done():
					cancelOnce.Do(func() { close(cancelled) })
					return hctx.Err()
				case <-unblock:
					return errors.New("ferrytest: the subtest ended")
				}
			}
			return nil
		}
		if !retry {
			mu.Lock()
			if newFirst < 0 {
				newFirst = m.Offset
			}
			mu.Unlock()
			newTally.Add(body)
		}
		return nil
	})
	opts := func(member string) []ferry.ConsumerOption {
		return []ferry.ConsumerOption{ferry.WithMemberID(member), ferry.WithAllocator(alloc), ferry.WithConcurrency(1),
			ferry.WithDrainTimeout(time.Minute)} // only the loss may cancel the blocked handler
	}
	old := StartConsumer(t, b1, "g", h, opts("m-old")...)
	StartConsumer(t, b2, "g", h, opts("m-new")...)
	t.Cleanup(func() { close(unblock) }) // cleanups run last first: before the consumers' Close
	e.waitFor("m-old holding the queue", func() bool { return len(old.Assigned()) == 1 })

	const n1 = 20
	Produce(t, b2, "t", "a", n1, 1)
	cursor := func() int64 {
		offs, err := e.be.Cursors.Load(ctx, "t", "g", 1)
		must(t, err, "load cursors")
		return offs[0]
	}
	e.waitFor("m-old committing the first messages", func() bool { return cursor() == n1 })
	Produce(t, b2, "t", "blk", 1, 1)
	Produce(t, b2, "t", "x", 10, 1)
	select {
	case <-blocked:
	case <-ctx.Done():
		t.Fatal("m-old never got the blocking message")
	}
	atLoss := cursor()
	lost.Store(true)
	e.be.Expire(g, "m-old")
	select {
	case <-cancelled:
	case <-time.After(min(lossBound, e.w.timeout/2)):
		t.Fatalf("m-old's handler was not cancelled %v after its session expired: its lease's Lost never closed, or the member ignored it (the holder of a lost lease must stop at once)", min(lossBound, e.w.timeout/2))
	case <-ctx.Done():
		t.Fatal("m-old's handler was not cancelled after its session expired")
	}
	e.waitAll(newTally)
	e.waitFor("m-new committing every message", func() bool { return cursor() == n1+11 })

	mu.Lock()
	check(t, len(oldAfter) == 0, "m-old handled %v after losing its lease (it must handle nothing more)", oldAfter)
	check(t, newFirst == atLoss, "the new owner started at offset %d, want %d, the last commit before the loss", newFirst, atLoss)
	mu.Unlock()

	var oldToken, newToken uint64
	for _, r := range oldLog.records() {
		if r.fenced && r.err == nil {
			oldToken = max(oldToken, r.token)
		}
		if r.after {
			check(t, false, "m-old committed %d (token %d, error %v) after the new owner's first commit: the holder of a lost lease commits nothing more", r.offset, r.token, r.err)
		}
		check(t, r.offset <= atLoss || r.err != nil, "m-old moved the cursor to %d, past the message it was handling when it lost the lease (%d)", r.offset, atLoss)
	}
	for _, r := range newLog.records() {
		if r.fenced && r.err == nil {
			newToken = max(newToken, r.token)
		}
	}
	fc, fenced := e.be.Cursors.(ferry.FencedCursorStore)
	if !fenced {
		t.Logf("ferrytest: the cursor store is not a FencedCursorStore: a late commit of a lost lease cannot be refused, not checked")
		return
	}
	if oldToken == 0 || newToken == 0 {
		t.Fatalf("no fenced commits seen (m-old's token %d, m-new's %d): the consumers' commits went unfenced to a FencedCursorStore", oldToken, newToken)
	}
	check(t, newToken > oldToken, "the new owner commits with token %d, not larger than the old owner's %d: tokens must grow with every Lock of the queue", newToken, oldToken)
	// A commit of the old owner still in flight at the loss lands now.
	err := fc.CommitFenced(ctx, "t", "g", 0, atLoss, oldToken)
	check(t, errors.Is(err, ferry.ErrFenced), "a late commit of the old owner (offset %d, token %d) after the new owner committed (token %d): got %v, want %v", atLoss, oldToken, newToken, err, ferry.ErrFenced)
	check(t, cursor() == n1+11, "the cursor is %d after the old owner's late commit, want %d: it moved back", cursor(), n1+11)
}

// stableWatch fails t when a member of a group, while the group is
// stable (from the settled split to the first Close), loses a queue (its
// revoke callback runs) or sees a commit refused with ErrFenced: a store
// that refuses a stable member's commit makes it lose a queue nobody
// took.
type stableWatch struct {
	t      interface{ Errorf(string, ...any) }
	stable atomic.Bool
}

func (w *stableWatch) opts(member string) []ferry.ConsumerOption {
	return []ferry.ConsumerOption{
		ferry.WithOnRevoked(func(q ferry.QueueID) {
			if w.stable.Load() {
				w.t.Errorf("member %s of a stable group lost queue %s (a refused commit? ErrFenced must follow only a real loss of the lease)", member, q)
			}
		}),
		ferry.WithOnError(func(err error) {
			if errors.Is(err, ferry.ErrFenced) && w.stable.Load() {
				w.t.Errorf("member %s of a stable group: a commit was refused: %v (ErrFenced must follow only a real loss of the lease)", member, err)
			}
		}),
	}
}
