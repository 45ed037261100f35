package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// CoordinatorOpener returns a fresh, empty coordinator for one subtest. It
// reports its own failures through t; the suite closes the coordinator.
type CoordinatorOpener func(t *testing.T) ferry.Coordinator

// CoordinatorFeatures says what a coordinator under test can do beyond
// what every [ferry.Coordinator] must.
type CoordinatorFeatures struct {
	// Expire, when set, makes the session of member in group g of c (a
	// coordinator open returned) expire as if the member had gone silent
	// for the implementation's time to live: [NewFakeCoordinator]'s
	// Expire, say, or a hook that stops a session's heartbeats. It may
	// return before the expiry takes effect; the suite waits for it. With
	// Expire, TestCoordinator checks what an expiry must do (the Expiry
	// subtest); without it, that subtest is skipped.
	Expire func(c ferry.Coordinator, g ferry.GroupKey, member string)
	// Peer, when set, returns another coordinator over the same groups,
	// members and locks as c (a coordinator open returned), as another
	// broker has it: a second instance over the same backing store, say,
	// or c itself for a coordinator the brokers of a process share
	// ([ferry.MemoryCoordinator]). The suite closes it. With Peer,
	// TestCoordinator checks what a change made through one does in the
	// other (the Peers subtest); without it, that subtest is skipped.
	Peer func(t *testing.T, c ferry.Coordinator) ferry.Coordinator
	// Timeout bounds each subtest (see the package doc on the watchdog).
	// Zero means [DefaultTimeout].
	Timeout time.Duration
}

// wakeBound is how long a Lock may take to return after the lock it
// waits for is released: a watchdog against polling on a long interval,
// not a performance bound.
const wakeBound = time.Second

// blockedFor is how long the suite watches a Lock that must not return
// (the lock is held elsewhere) before it takes it as blocked.
const blockedFor = 30 * time.Millisecond

// pollEvery is how often the suite reads [ferry.Coordinator.Members]
// again while it waits for a change the contract lets show eventually
// (one made through another coordinator, or an expiry): nothing signals
// it, so the suite asks until the watchdog ends the subtest.
const pollEvery = 10 * time.Millisecond

// TestCoordinator checks that the coordinators open returns keep the
// contract of [ferry.Coordinator], [ferry.Session] and [ferry.Lease]. Each
// subtest gets a fresh coordinator and a watchdog: every wait is bounded,
// so a coordinator that never answers fails instead of hanging. The
// subtests:
//
//   - Join: Changed has a value right after Join; Members (of the session
//     and of the coordinator) is the sorted members, self included; a
//     group nobody joined has none; the same member ID may join another
//     group or topic, but a live member joining its group again is
//     [ferry.ErrInvalidOption].
//   - JoinInvalid: an empty scope, an empty member or a bad topic name is
//     [ferry.ErrInvalidOption] (a bad topic name may be
//     [ferry.ErrInvalidTopic]); a cancelled ctx is its error. None joins.
//   - Membership: the coordinator's Members reads its own writes: right
//     after a Join or Leave through it returns (before any session is
//     waited for), Members shows it; every session gets a Changed value
//     after each join and leave in its group, after which Members shows
//     it; a member that left may join again.
//   - LockExclusive: a second session's Lock of a held queue waits until
//     the holder releases it; Release twice is nil.
//   - LockCancel: a waiting Lock returns its ctx's error when ctx is done,
//     and the queue can be locked afterwards.
//   - LockIndependent: locks of other queues, groups and topics do not
//     wait for each other, at every queue index: queues that differ in
//     any one bit of their index (0 and 1<<k, MaxQueues-1 and
//     MaxQueues-1 with bit k cleared) have locks of their own.
//   - Tokens: every Lock of a (group, queue) gets a token larger than all
//     before it, across sessions and after a leave and a rejoin.
//   - TokenOrder: tokens grow in the order the lock is granted, not the
//     order Locks start: a holder releases and locks again while another
//     session waits, many times over, and every grant's token is larger
//     than the grant's before it.
//   - Leave: the session's Done is closed, its leases not released are
//     lost (Lost closed) by then and before the Lock of another session
//     waiting for one returns, another session locks their queues at
//     once, a Lock waiting in it and any Lock after it are
//     [ferry.ErrSessionExpired], Leave and Release again are nil, the
//     coordinator's Members no longer lists it as soon as Leave returns,
//     and the others see it leave.
//   - Wake: a waiting Lock returns within a second of the Release (or
//     Leave) it waits for, and, measured over several rounds, about as
//     fast as an unwaited Release and Lock: it is woken, not polling.
//   - Close: every session's Done is closed, and by the time it is, the
//     Lost of every lease of the session; Lock (waiting or new) is
//     [ferry.ErrSessionExpired]; Join and Members are [ferry.ErrClosed];
//     Close twice is nil.
//   - Expiry (with [CoordinatorFeatures].Expire): an expired member's
//     leases are lost (Lost closed) before another session's Lock of the
//     queue returns, with a larger token; its Done is closed; a Lock
//     waiting in it is [ferry.ErrSessionExpired]; the others see it
//     leave, and so does the coordinator's Members, eventually; Release
//     and Leave are nil afterwards; it may join again.
//   - ConcurrentLocks: many sessions lock and release one queue at once
//     (run it with -race): never two holders, tokens strictly increasing
//     in the order the lock was taken.
//   - ConcurrentMembership: members joining and leaving at once end in
//     the membership every session sees.
//   - NilContext: Join, Members, Lock, Release and Leave with a nil
//     context are [ferry.ErrInvalidOption], never a panic, and change
//     nothing: the member stays alone in its group, its session and
//     lease live, and the lock stays held.
//   - Peers (with [CoordinatorFeatures].Peer): a Join or Leave through
//     one coordinator shows in the other's sessions (a Changed value,
//     then Members) and, eventually, in its Members, while each reads
//     its own writes at once; a lock held through one makes a Lock
//     through the other wait until it is released, and the token grows.
func TestCoordinator(t *testing.T, f CoordinatorFeatures, open CoordinatorOpener) {
	t.Helper()
	s := &coordSuite{f: f, open: open}
	ff := Features{Timeout: f.Timeout}
	run(t, ff, "Join", s.join)
	run(t, ff, "JoinInvalid", s.joinInvalid)
	run(t, ff, "Membership", s.membership)
	run(t, ff, "LockExclusive", s.lockExclusive)
	run(t, ff, "LockCancel", s.lockCancel)
	run(t, ff, "LockIndependent", s.lockIndependent)
	run(t, ff, "Tokens", s.tokens)
	run(t, ff, "TokenOrder", s.tokenOrder)
	run(t, ff, "Leave", s.leave)
	run(t, ff, "Wake", s.wake)
	run(t, ff, "Close", s.close)
	run(t, ff, "Expiry", s.expiry)
	run(t, ff, "ConcurrentLocks", s.concurrentLocks)
	run(t, ff, "ConcurrentMembership", s.concurrentMembership)
	run(t, ff, "NilContext", s.nilContext)
	run(t, ff, "Peers", s.peers)
}

type coordSuite struct {
	f    CoordinatorFeatures
	open CoordinatorOpener
}

// The groups the suite uses: two scopes on one topic, and one scope on two.
var (
	gOrders    = ferry.GroupKey{Scope: "billing", Topic: "orders"}
	gOrders2   = ferry.GroupKey{Scope: "shipping", Topic: "orders"}
	gPayments  = ferry.GroupKey{Scope: "billing", Topic: "payments"}
	gBroadcast = ferry.GroupKey{Scope: "audit@node-1", Topic: "orders"}
)

func (s *coordSuite) openC(t *testing.T, w *watchdog) ferry.Coordinator {
	t.Helper()
	c := s.open(t)
	if c == nil {
		t.Fatal("ferrytest: the coordinator opener returned nil")
	}
	w.closeOnHang(c)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func joinC(t *testing.T, w *watchdog, c ferry.Coordinator, g ferry.GroupKey, member string) ferry.Session {
	t.Helper()
	sess, err := c.Join(w.ctx, g, member)
	must(t, err, fmt.Sprintf("Join(%s, %q)", g, member))
	if sess == nil {
		t.Fatalf("Join(%s, %q) returned a nil session and no error", g, member)
	}
	return sess
}

func lockQ(t *testing.T, w *watchdog, sess ferry.Session, what string, q int) ferry.Lease {
	t.Helper()
	l, err := sess.Lock(w.ctx, q)
	must(t, err, fmt.Sprintf("Lock of queue %d by %s", q, what))
	if l == nil {
		t.Fatalf("Lock of queue %d by %s returned a nil lease and no error", q, what)
	}
	return l
}

// waitMembers waits for a value of sess.Changed after which sess.Members
// is want: each call must follow a membership change made after the
// previous call's return.
func waitMembers(t *testing.T, w *watchdog, sess ferry.Session, who string, want ...string) {
	t.Helper()
	for {
		select {
		case <-sess.Changed():
		case <-w.ctx.Done():
			t.Fatalf("%s: no value on Changed after a membership change: Members() = %v, want %v", who, sess.Members(), want)
		}
		if got := sess.Members(); slices.Equal(got, want) {
			return
		}
	}
}

// wantMembers checks that c.Members(g) is want now: for a change made
// through c, which c's Members must show once the call that made it has
// returned.
func wantMembers(t *testing.T, w *watchdog, c ferry.Coordinator, g ferry.GroupKey, want ...string) {
	t.Helper()
	got, err := c.Members(w.ctx, g)
	must(t, err, fmt.Sprintf("Coordinator.Members(%s)", g))
	if !sameMembers(got, want) {
		t.Fatalf("Coordinator.Members(%s) = %v, want %v: a coordinator's Members must read its own Joins and Leaves", g, got, want)
	}
}

// eventuallyMembers waits until c.Members(g) is want: for a change c did
// not make (an expiry, or a Join or Leave through another coordinator),
// which the contract lets show eventually. It reads again every pollEvery
// until the watchdog ends the subtest.
func eventuallyMembers(t *testing.T, w *watchdog, c ferry.Coordinator, g ferry.GroupKey, what string, want ...string) {
	t.Helper()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		got, err := c.Members(w.ctx, g)
		if err != nil && w.ctx.Err() == nil {
			must(t, err, fmt.Sprintf("%s: Coordinator.Members(%s)", what, g))
		}
		if err == nil && sameMembers(got, want) {
			return
		}
		select {
		case <-tick.C:
		case <-w.ctx.Done():
			t.Fatalf("%s: Coordinator.Members(%s) = %v, want %v eventually", what, g, got, want)
		}
	}
}

// sameMembers compares member lists, nil and empty alike.
func sameMembers(got, want []string) bool {
	return len(got) == 0 && len(want) == 0 || slices.Equal(got, want)
}

// wantListed checks that c.Members(g) lists member (or, with listed
// false, does not), whatever else it lists: after a Join or Leave through
// c, while changes made elsewhere may not show yet.
func wantListed(t *testing.T, w *watchdog, c ferry.Coordinator, g ferry.GroupKey, member string, listed bool, what string) {
	t.Helper()
	got, err := c.Members(w.ctx, g)
	must(t, err, fmt.Sprintf("%s: Coordinator.Members(%s)", what, g))
	if slices.Contains(got, member) != listed {
		t.Fatalf("%s: Coordinator.Members(%s) = %v: %q listed %v, want %v: a coordinator's Members must read its own Joins and Leaves", what, g, got, member, !listed, listed)
	}
}

// lockResult is what a Lock run in a goroutine returned.
type lockResult struct {
	l   ferry.Lease
	err error
	at  time.Time
}

// goLock runs sess.Lock(ctx, q) in a goroutine and returns where its
// result comes. The goroutine is waited for when the subtest ends (its
// ctx, the watchdog's, is cancelled by then).
func goLock(t *testing.T, w *watchdog, ctx context.Context, sess ferry.Session, q int) <-chan lockResult {
	ch := make(chan lockResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := sess.Lock(ctx, q)
		ch <- lockResult{l, err, time.Now()}
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(w.timeout):
			t.Errorf("ferrytest: a Lock of queue %d was still running %v after the subtest ended and its ctx was cancelled", q, w.timeout)
		}
	})
	return ch
}

// awaitLock waits for the result of goLock, failing if it does not come.
func awaitLock(t *testing.T, w *watchdog, ch <-chan lockResult, what string) lockResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-w.ctx.Done():
		t.Fatalf("%s: Lock did not return", what)
		return lockResult{}
	}
}

// stillBlocked fails if the Lock of ch returns within blockedFor.
func stillBlocked(t *testing.T, ch <-chan lockResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		tok := uint64(0)
		if r.l != nil {
			tok = r.l.Token()
		}
		t.Fatalf("%s: Lock returned (token %d, error %v) while another session holds the lock: two holders", what, tok, r.err)
	case <-time.After(blockedFor):
	}
}

// isClosed reports whether ch is closed (or has a value) now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func awaitClosed(t *testing.T, w *watchdog, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-w.ctx.Done():
		t.Fatalf("%s was not closed", what)
	}
}

func release(t *testing.T, w *watchdog, l ferry.Lease, what string) {
	t.Helper()
	must(t, l.Release(w.ctx), "Release of "+what)
}

func (s *coordSuite) join(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	wantMembers(t, w, c, gOrders)
	a := joinC(t, w, c, gOrders, "m-b")
	waitMembers(t, w, a, "m-b after its Join", "m-b")
	wantMembers(t, w, c, gOrders, "m-b")
	b := joinC(t, w, c, gOrders, "m-a")
	waitMembers(t, w, b, "m-a after its Join", "m-a", "m-b")
	waitMembers(t, w, a, "m-b after m-a joined", "m-a", "m-b")
	wantMembers(t, w, c, gOrders, "m-a", "m-b")

	_, err := c.Join(w.ctx, gOrders, "m-a")
	wantErr(t, err, ferry.ErrInvalidOption, "a second Join of a live member")
	wantMembers(t, w, c, gOrders, "m-a", "m-b")

	for _, g := range []ferry.GroupKey{gOrders2, gPayments, gBroadcast} {
		o := joinC(t, w, c, g, "m-a")
		waitMembers(t, w, o, fmt.Sprintf("m-a in %s", g), "m-a")
		wantMembers(t, w, c, g, "m-a")
	}
	wantMembers(t, w, c, gOrders, "m-a", "m-b")
	wantMembers(t, w, c, ferry.GroupKey{Scope: "nobody", Topic: "orders"})
}

func (s *coordSuite) joinInvalid(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	for _, k := range []struct {
		g      ferry.GroupKey
		member string
		what   string
	}{
		{ferry.GroupKey{Topic: "orders"}, "m-a", "an empty scope"},
		{gOrders, "", "an empty member"},
		{ferry.GroupKey{}, "m-a", "an empty key"},
	} {
		_, err := c.Join(w.ctx, k.g, k.member)
		wantErr(t, err, ferry.ErrInvalidOption, "Join with "+k.what)
	}
	for _, topic := range []string{"", "..", "a b", "a/b"} {
		_, err := c.Join(w.ctx, ferry.GroupKey{Scope: "billing", Topic: topic}, "m-a")
		if err == nil || !(errors.Is(err, ferry.ErrInvalidOption) || errors.Is(err, ferry.ErrInvalidTopic)) {
			t.Fatalf("Join with topic %q: got error %v, want one matching %v (or %v)", topic, err, ferry.ErrInvalidOption, ferry.ErrInvalidTopic)
		}
	}
	ctx, cancel := context.WithCancel(w.ctx)
	cancel()
	_, err := c.Join(ctx, gOrders, "m-a")
	wantErr(t, err, context.Canceled, "Join with a cancelled ctx")
	wantMembers(t, w, c, gOrders)
	a := joinC(t, w, c, gOrders, "m-a") // nothing was left behind
	waitMembers(t, w, a, "m-a", "m-a")
}

func (s *coordSuite) membership(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	// Each Join and Leave is followed at once by the coordinator's
	// Members (it reads its own writes), then by waits for the sessions.
	x := joinC(t, w, c, gOrders2, "m-x") // another group: sees nothing of gOrders
	wantMembers(t, w, c, gOrders2, "m-x")
	waitMembers(t, w, x, "m-x", "m-x")
	c3 := joinC(t, w, c, gOrders, "m-c")
	wantMembers(t, w, c, gOrders, "m-c")
	waitMembers(t, w, c3, "m-c", "m-c")
	a := joinC(t, w, c, gOrders, "m-a")
	wantMembers(t, w, c, gOrders, "m-a", "m-c")
	waitMembers(t, w, a, "m-a", "m-a", "m-c")
	waitMembers(t, w, c3, "m-c after m-a joined", "m-a", "m-c")
	b := joinC(t, w, c, gOrders, "m-b")
	wantMembers(t, w, c, gOrders, "m-a", "m-b", "m-c")
	for _, o := range []struct {
		s    ferry.Session
		name string
	}{{a, "m-a"}, {b, "m-b"}, {c3, "m-c"}} {
		waitMembers(t, w, o.s, o.name+" after m-b joined", "m-a", "m-b", "m-c")
	}

	must(t, b.Leave(w.ctx), "Leave of m-b")
	wantMembers(t, w, c, gOrders, "m-a", "m-c")
	waitMembers(t, w, a, "m-a after m-b left", "m-a", "m-c")
	waitMembers(t, w, c3, "m-c after m-b left", "m-a", "m-c")

	b = joinC(t, w, c, gOrders, "m-b") // joins again
	wantMembers(t, w, c, gOrders, "m-a", "m-b", "m-c")
	waitMembers(t, w, b, "m-b joined again", "m-a", "m-b", "m-c")
	waitMembers(t, w, a, "m-a after m-b joined again", "m-a", "m-b", "m-c")
	must(t, a.Leave(w.ctx), "Leave of m-a")
	wantMembers(t, w, c, gOrders, "m-b", "m-c")
	must(t, c3.Leave(w.ctx), "Leave of m-c")
	wantMembers(t, w, c, gOrders, "m-b")
	waitMembers(t, w, b, "m-b after m-a and m-c left", "m-b")
	must(t, b.Leave(w.ctx), "Leave of m-b")
	wantMembers(t, w, c, gOrders)

	if got := x.Members(); !slices.Equal(got, []string{"m-x"}) {
		t.Fatalf("m-x of %s: Members() = %v, want [m-x]: changes of another group leaked in", gOrders2, got)
	}
	wantMembers(t, w, c, gOrders2, "m-x")
}
