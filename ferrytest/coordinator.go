package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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

func (s *coordSuite) lockExclusive(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	la := lockQ(t, w, a, "m-a", 3)
	ch := goLock(t, w, w.ctx, b, 3)
	stillBlocked(t, ch, "m-b locking queue 3 held by m-a")
	release(t, w, la, "m-a's lease")
	r := awaitLock(t, w, ch, "m-b locking queue 3 after m-a released it")
	must(t, r.err, "Lock of queue 3 by m-b after m-a released it")
	if r.l.Token() <= la.Token() {
		t.Fatalf("token %d of the second Lock of a queue is not larger than the first's %d", r.l.Token(), la.Token())
	}
	must(t, la.Release(w.ctx), "a second Release of m-a's released lease")
	ch = goLock(t, w, w.ctx, a, 3) // the stale Release gave nothing up
	stillBlocked(t, ch, "m-a locking queue 3 held by m-b (after m-a released its old lease twice)")
	release(t, w, r.l, "m-b's lease")
	release(t, w, r.l, "m-b's lease, twice")
	r2 := awaitLock(t, w, ch, "m-a locking queue 3 after m-b released it")
	must(t, r2.err, "Lock of queue 3 by m-a after m-b released it")
	if r2.l.Token() <= r.l.Token() {
		t.Fatalf("token %d of the third Lock of a queue is not larger than the second's %d", r2.l.Token(), r.l.Token())
	}
	if isClosed(la.Lost()) || isClosed(r.l.Lost()) {
		t.Fatal("Lost of a released lease was closed: Release is not a loss")
	}
}

func (s *coordSuite) lockCancel(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	la := lockQ(t, w, a, "m-a", 0)

	ctx, cancel := context.WithCancel(w.ctx)
	ch := goLock(t, w, ctx, b, 0)
	stillBlocked(t, ch, "m-b locking queue 0 held by m-a")
	cancel()
	r := awaitLock(t, w, ch, "m-b's Lock after its ctx was cancelled")
	if r.err == nil {
		t.Fatal("a waiting Lock whose ctx was cancelled took the lock held by another session")
	}
	wantErr(t, r.err, context.Canceled, "a waiting Lock whose ctx was cancelled")

	dctx, dcancel := context.WithTimeout(w.ctx, blockedFor)
	defer dcancel()
	_, err := b.Lock(dctx, 0)
	wantErr(t, err, context.DeadlineExceeded, "a waiting Lock whose ctx's deadline passed")

	release(t, w, la, "m-a's lease")
	lb := lockQ(t, w, b, "m-b after its cancelled Locks", 0)
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after cancelled Locks is not larger than the holder's before %d", lb.Token(), la.Token())
	}
}

func (s *coordSuite) lockIndependent(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	lockQ(t, w, a, "m-a", 0)
	lockQ(t, w, a, "m-a, a second queue", 1) // one session, several queues
	lockQ(t, w, b, "m-b, another queue of the group", 2)
	// The same queue in other groups and topics, and a high queue index.
	for _, g := range []ferry.GroupKey{gOrders2, gPayments, gBroadcast} {
		o := joinC(t, w, c, g, "m-b")
		lockQ(t, w, o, fmt.Sprintf("m-b in %s", g), 0)
		lockQ(t, w, o, fmt.Sprintf("m-b in %s", g), 1)
	}
	lockQ(t, w, b, "m-b, queue MaxQueues-1", ferry.MaxQueues-1)
	_, err := b.Lock(w.ctx, -1)
	wantErr(t, err, ferry.ErrInvalidOption, "Lock of queue -1")

	// Every bit of the index counts: with queues 0 and MaxQueues-1 held
	// in one group, another session locks each queue one bit away from
	// them. An implementation that keys its locks by part of the index
	// (its low byte, say) makes one of these wait for a held lock.
	gBits := ferry.GroupKey{Scope: "bits", Topic: "orders"}
	h := joinC(t, w, c, gBits, "m-a")
	o := joinC(t, w, c, gBits, "m-b")
	lockQ(t, w, h, "m-a in "+gBits.String(), 0)
	lockQ(t, w, h, "m-a in "+gBits.String(), ferry.MaxQueues-1)
	for bit := 1; bit < ferry.MaxQueues; bit <<= 1 {
		for _, q := range []struct{ q, held int }{{bit, 0}, {(ferry.MaxQueues - 1) &^ bit, ferry.MaxQueues - 1}} {
			lockFree(t, w, o, q.q, q.held)
		}
	}
}

// freeBound bounds the Lock of a queue nobody holds: a watchdog (a
// correct Lock returns in a round trip), not a performance bound.
const freeBound = 5 * time.Second

// lockFree locks queue q, which nobody holds, in sess, failing if the
// Lock waits (for the lock of queue held, as it would if they shared one).
func lockFree(t *testing.T, w *watchdog, sess ferry.Session, q, held int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, min(freeBound, w.timeout/2))
	defer cancel()
	l, err := sess.Lock(ctx, q)
	if err != nil && ctx.Err() != nil && w.ctx.Err() == nil {
		t.Fatalf("Lock of free queue %d waited %v while another session held queue %d: the two queues share a lock (is the queue index cut to fewer bits?)", q, min(freeBound, w.timeout/2), held)
	}
	must(t, err, fmt.Sprintf("Lock of free queue %d", q))
	if l == nil {
		t.Fatalf("Lock of queue %d returned a nil lease and no error", q)
	}
}

func (s *coordSuite) tokens(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	var last uint64
	check := func(l ferry.Lease, what string) {
		t.Helper()
		if l.Token() <= last {
			t.Fatalf("token %d of %s is not larger than the previous Lock's %d", l.Token(), what, last)
		}
		last = l.Token()
	}
	for i := range 3 {
		for _, o := range []struct {
			s    ferry.Session
			name string
		}{{a, "m-a"}, {b, "m-b"}, {a, "m-a"}} {
			what := fmt.Sprintf("Lock %d by %s", i, o.name)
			l := lockQ(t, w, o.s, what, 5)
			check(l, what)
			release(t, w, l, what)
		}
	}
	l := lockQ(t, w, a, "m-a before leaving", 5)
	check(l, "m-a's Lock before leaving")
	must(t, a.Leave(w.ctx), "Leave of m-a holding the lock")
	l = lockQ(t, w, b, "m-b after m-a left holding it", 5)
	check(l, "m-b's Lock after m-a left holding it")
	release(t, w, l, "m-b's lease")
	must(t, b.Leave(w.ctx), "Leave of m-b")
	wantMembers(t, w, c, gOrders)
	a = joinC(t, w, c, gOrders, "m-a") // the group emptied and came back
	l = lockQ(t, w, a, "m-a joined again", 5)
	check(l, "m-a's Lock after the group emptied and m-a joined again")
	// Another queue's and another group's tokens do not matter, but a
	// lock there must not lower this queue's.
	o := joinC(t, w, c, gOrders2, "m-a")
	lockQ(t, w, o, "m-a in another group", 5)
	lockQ(t, w, a, "m-a, another queue", 6)
	release(t, w, l, "m-a's lease")
	l = lockQ(t, w, a, "m-a, last", 5)
	check(l, "the last Lock")
}

// tokenOrderCycles is how many times TokenOrder's holder releases and
// locks again while the other session waits (every other cycle the waiter
// is let win alone). An early token shows in a cycle the waiter wins after
// one the holder won: left to timing, a loaded machine once let the holder
// win every cycle after the waiter's first ones, and the negative control
// passed a broken coordinator.
const tokenOrderCycles = 50

// tokenOrder checks that tokens grow in grant order. A token drawn when a
// Lock starts, rather than when it is granted, shows once a Lock that
// started later is granted first: here, when the holder releases and
// locks again while another session waits, and the holder's new Lock
// wins. Which Lock wins each cycle is the implementation's: the check
// holds whichever does. A fair (first come, first served) one always
// grants the waiter, so its grant order is its start order and an early
// token cannot show, nor do harm; one that lets the new Lock win at all
// (the memory coordinator does, as the waiter must first be woken) is
// all but sure to let it win in some of the cycles. How many the holder
// won is logged.
func (s *coordSuite) tokenOrder(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	const q = 4
	sess := map[string]ferry.Session{"m-a": joinC(t, w, c, gOrders, "m-a"), "m-b": joinC(t, w, c, gOrders, "m-b")}
	holder, waiter := "m-a", "m-b"
	held := lockQ(t, w, sess[holder], holder, q)
	last := held.Token()
	waiting := goLock(t, w, w.ctx, sess[waiter], q)
	stillBlocked(t, waiting, waiter+" locking queue 4 held by "+holder)
	holderWins := 0
	granted := func(r lockResult, who string, i int) {
		t.Helper()
		must(t, r.err, fmt.Sprintf("Lock of queue %d by %s (cycle %d)", q, who, i))
		if r.l.Token() <= last {
			t.Fatalf("cycle %d: the Lock of %s was granted token %d after a grant of token %d: tokens must grow in the order the lock is granted (is the token drawn when a Lock starts waiting?)",
				i, who, r.l.Token(), last)
		}
		last, held = r.l.Token(), r.l
	}
	for i := range tokenOrderCycles {
		release(t, w, held, holder+"'s lease")
		if i%2 == 1 {
			// The waiter alone, so that it wins: after a cycle the holder
			// may have won, an early token shows here whatever the timing.
			granted(awaitLock(t, w, waiting, fmt.Sprintf("%s locking queue 4, alone (cycle %d)", waiter, i)), waiter, i)
			holder, waiter = waiter, holder
			waiting = goLock(t, w, w.ctx, sess[waiter], q)
			stillBlocked(t, waiting, waiter+" locking queue 4 held by "+holder)
			w.progress()
			continue
		}
		relock := goLock(t, w, w.ctx, sess[holder], q)
		select {
		case r := <-relock: // the holder won; the waiter waits on
			holderWins++
			granted(r, holder, i)
		case r := <-waiting: // the waiter won; the old holder waits now
			granted(r, waiter, i)
			holder, waiter, waiting = waiter, holder, relock
		case <-w.ctx.Done():
			t.Fatalf("cycle %d: neither the waiting Lock of %s nor the new Lock of %s returned after %s released the lock", i, waiter, holder, holder)
		}
		w.progress()
	}
	release(t, w, held, holder+"'s lease")
	granted(awaitLock(t, w, waiting, waiter+" locking queue 4 at last"), waiter, tokenOrderCycles)
	t.Logf("the holder's new Lock won %d of %d contended cycles over the waiting one", holderWins, tokenOrderCycles/2)
}

func (s *coordSuite) leave(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	waitMembers(t, w, b, "m-b", "m-a", "m-b")
	la0 := lockQ(t, w, a, "m-a", 0)
	la1 := lockQ(t, w, a, "m-a", 1)
	lb2 := lockQ(t, w, b, "m-b", 2)
	waiting := goLock(t, w, w.ctx, b, 0)
	waitingA := goLock(t, w, w.ctx, a, 2) // held by m-b: waits in m-a until it leaves
	stillBlocked(t, waiting, "m-b locking queue 0 held by m-a")
	stillBlocked(t, waitingA, "m-a locking queue 2 held by m-b")
	if isClosed(a.Done()) {
		t.Fatal("Done of a live session is closed")
	}

	must(t, a.Leave(w.ctx), "Leave")
	r := awaitLock(t, w, waiting, "m-b locking queue 0 after its holder m-a left")
	// Checked before anything else: the lease m-a left holding is lost
	// before anyone else could lock its queue.
	lost := isClosed(la0.Lost())
	must(t, r.err, "Lock of queue 0 after its holder left")
	if !lost {
		t.Fatal("m-b's Lock of queue 0 returned before Lost of the lease m-a held when it left was closed: a session that ends loses the leases it did not release, before anyone else can lock their queues (Lease.Lost)")
	}
	if r.l.Token() <= la0.Token() {
		t.Fatalf("token %d after the holder left is not larger than the holder's %d", r.l.Token(), la0.Token())
	}
	wantMembers(t, w, c, gOrders, "m-b") // the coordinator reads its own Leave
	awaitClosed(t, w, a.Done(), "Done of a session that left")
	if !isClosed(la1.Lost()) {
		t.Fatal("Done of a session that left was closed before Lost of a lease it held: every lease of the session is lost by the time Done is closed (Session.Done)")
	}
	lockQ(t, w, b, "m-b, queue 1 after its holder m-a left", 1)
	rA := awaitLock(t, w, waitingA, "m-a's waiting Lock after m-a left")
	wantErr(t, rA.err, ferry.ErrSessionExpired, "a Lock waiting in a session that left")
	_, err := a.Lock(w.ctx, 3)
	wantErr(t, err, ferry.ErrSessionExpired, "Lock after Leave")
	must(t, a.Leave(w.ctx), "a second Leave")
	must(t, la0.Release(w.ctx), "Release of a lease of a session that left")
	must(t, la1.Release(w.ctx), "Release of a lease of a session that left")
	waitMembers(t, w, b, "m-b after m-a left", "m-b")
	release(t, w, lb2, "m-b's lease of queue 2")
}

func (s *coordSuite) wake(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	wakes := func(what string, ch <-chan lockResult, free func()) ferry.Lease {
		t.Helper()
		stillBlocked(t, ch, what)
		start := time.Now()
		free()
		select {
		case r := <-ch:
			must(t, r.err, what)
			return r.l
		case <-time.After(wakeBound):
			t.Fatalf("%s: Lock still waiting %v after the lock was freed: not woken (polling?)", what, wakeBound)
		case <-w.ctx.Done():
			t.Fatalf("%s: Lock did not return after the lock was freed %v ago", what, time.Since(start))
		}
		return nil
	}
	la := lockQ(t, w, a, "m-a", 0)
	lb := wakes("m-b waiting for m-a's Release", goLock(t, w, w.ctx, b, 0), func() { release(t, w, la, "m-a's lease") })
	wakes("m-a waiting for m-b's Release", goLock(t, w, w.ctx, a, 0), func() { release(t, w, lb, "m-b's lease") })
	// a holds queue 0 again; a third member waits for a to leave.
	m := joinC(t, w, c, gOrders, "m-c")
	wakes("m-c waiting for m-a's Leave", goLock(t, w, w.ctx, m, 0), func() { must(t, a.Leave(w.ctx), "Leave of m-a") })
	s.signalled(t, w, c)
}

// Wake's measure of signalled waiting. A poller with interval P returns
// up to P after the Release; a woken Lock in about the time of a Release
// and an unwaited Lock (a round trip each, plus the wake-up). Single
// timings on a loaded machine say little, so the suite compares medians
// over wakeRounds rounds, each timing a waited Lock (W: from just before
// the Release to the waiter's return) beside the same work unwaited (R: a
// Release, then another session's Lock of the freed queue), and fails
// only if median(W) > wakeFactor·median(R) + wakeSlack in each of
// wakeAttempts attempts. Load slows R as it slows W, and one slow attempt
// is tried again, so a signalled implementation does not fail on a busy
// machine; a poller fails every attempt alike: the waiter's Lock starts
// (its first try fails, then it sleeps) 5 to 19 ms before the Release, so
// a poller started with it wakes P-19 to P-5 ms after the Release: a
// median above wakeSlack for any interval from about 45 ms up. A poller of
// a shorter interval is indistinguishable from a slow wake-up here (and
// costs little); a backend whose round trips are slow gets the proportion.
const (
	wakeRounds   = 8
	wakeAttempts = 3
	wakeFactor   = 3
	wakeSlack    = 25 * time.Millisecond
)

func (s *coordSuite) signalled(t *testing.T, w *watchdog, c ferry.Coordinator) {
	t.Helper()
	const q = 9
	a := joinC(t, w, c, gPayments, "m-a")
	b := joinC(t, w, c, gPayments, "m-b")
	var mw, mr time.Duration
	for attempt := range wakeAttempts {
		ws, rs := make([]time.Duration, wakeRounds), make([]time.Duration, wakeRounds)
		for i := range wakeRounds {
			l := lockQ(t, w, a, "m-a", q)
			start := time.Now()
			release(t, w, l, "m-a's lease")
			l = lockQ(t, w, b, "m-b, unwaited", q)
			rs[i] = time.Since(start)
			release(t, w, l, "m-b's lease")

			l = lockQ(t, w, a, "m-a", q)
			ch := goLock(t, w, w.ctx, b, q)
			pause := time.NewTimer(5*time.Millisecond + time.Duration(i)*2*time.Millisecond) // the waiter starts waiting meanwhile
			select {
			case r := <-ch:
				pause.Stop()
				tok := uint64(0)
				if r.l != nil {
					tok = r.l.Token()
				}
				t.Fatalf("m-b locking queue %d held by m-a: Lock returned (token %d, error %v): two holders", q, tok, r.err)
			case <-pause.C:
			}
			start = time.Now()
			release(t, w, l, "m-a's lease")
			r := awaitLock(t, w, ch, "m-b locking queue 9 after m-a released it")
			must(t, r.err, "Lock of queue 9 by m-b after m-a released it")
			ws[i] = r.at.Sub(start)
			release(t, w, r.l, "m-b's lease")
		}
		mw, mr = median(ws), median(rs)
		if mw <= wakeFactor*mr+wakeSlack {
			t.Logf("Wake: median wake-up %v after the Release, median unwaited Release and Lock %v (attempt %d)", mw, mr, attempt+1)
			return
		}
		t.Logf("Wake attempt %d: median wake-up %v after the Release, median unwaited Release and Lock %v: slow (waking: %v; unwaited: %v)", attempt+1, mw, mr, ws, rs)
		w.progress()
	}
	t.Fatalf("a waiting Lock returned a median %v after the Release it waited for, %d times in a row, while an unwaited Release and Lock took %v: not woken (polling?); want at most %d× that plus %v",
		mw, wakeAttempts, mr, wakeFactor, wakeSlack)
}

// median returns the median of ds, which it sorts.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	n := len(ds)
	if n%2 == 1 {
		return ds[n/2]
	}
	return (ds[n/2-1] + ds[n/2]) / 2
}

func (s *coordSuite) close(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	p := joinC(t, w, c, gPayments, "m-a")
	var leases []ferry.Lease
	leases = append(leases, lockQ(t, w, a, "m-a", 0), lockQ(t, w, a, "m-a", 1), lockQ(t, w, b, "m-b", 2), lockQ(t, w, p, "m-a in payments", 0))
	waiting := goLock(t, w, w.ctx, b, 0)
	stillBlocked(t, waiting, "m-b locking queue 0 held by m-a")

	must(t, c.Close(), "Close")
	of := [][]int{{0, 1}, {2}, {3}} // the leases of a, b and p
	for i, sess := range []ferry.Session{a, b, p} {
		awaitClosed(t, w, sess.Done(), fmt.Sprintf("Done of session %d after Close", i))
		for _, j := range of[i] {
			if !isClosed(leases[j].Lost()) {
				t.Fatalf("Done of session %d was closed before Lost of its lease %d (token %d): every lease of the session is lost by the time Done is closed (Session.Done)", i, j, leases[j].Token())
			}
		}
	}
	for i, l := range leases {
		awaitClosed(t, w, l.Lost(), fmt.Sprintf("Lost of lease %d (token %d) after Close", i, l.Token()))
	}
	r := awaitLock(t, w, waiting, "a Lock waiting when the coordinator closed")
	wantErr(t, r.err, ferry.ErrSessionExpired, "a Lock waiting when the coordinator closed")
	_, err := b.Lock(w.ctx, 7)
	wantErr(t, err, ferry.ErrSessionExpired, "Lock after Close")
	_, err = c.Join(w.ctx, gOrders, "m-c")
	wantErr(t, err, ferry.ErrClosed, "Join after Close")
	_, err = c.Join(w.ctx, gOrders2, "m-a")
	wantErr(t, err, ferry.ErrClosed, "Join of a new group after Close")
	_, err = c.Members(w.ctx, gOrders)
	wantErr(t, err, ferry.ErrClosed, "Members after Close")
	for i, l := range leases {
		if err := l.Release(w.ctx); err != nil && !errors.Is(err, ferry.ErrClosed) {
			t.Fatalf("Release of lease %d after Close: %v, want nil (or %v)", i, err, ferry.ErrClosed)
		}
	}
	for i, sess := range []ferry.Session{a, b, p} {
		if err := sess.Leave(w.ctx); err != nil && !errors.Is(err, ferry.ErrClosed) {
			t.Fatalf("Leave of session %d after Close: %v, want nil (or %v)", i, err, ferry.ErrClosed)
		}
	}
	must(t, c.Close(), "a second Close")
}

func (s *coordSuite) expiry(t *testing.T, w *watchdog) {
	if s.f.Expire == nil {
		t.Skip("ferrytest: CoordinatorFeatures.Expire not set: cannot make a session expire")
	}
	c := s.openC(t, w)
	a := joinC(t, w, c, gOrders, "m-a")
	b := joinC(t, w, c, gOrders, "m-b")
	m := joinC(t, w, c, gOrders, "m-c")
	o := joinC(t, w, c, gOrders2, "m-a") // m-a in another group: lives on
	waitMembers(t, w, b, "m-b", "m-a", "m-b", "m-c")
	waitMembers(t, w, m, "m-c", "m-a", "m-b", "m-c")
	la := []ferry.Lease{lockQ(t, w, a, "m-a", 0), lockQ(t, w, a, "m-a", 1)}
	lo := lockQ(t, w, o, "m-a in another group", 0)
	lb := lockQ(t, w, b, "m-b", 2)
	waiting := []<-chan lockResult{goLock(t, w, w.ctx, b, 0), goLock(t, w, w.ctx, m, 1)}
	waitingA := goLock(t, w, w.ctx, a, 2)
	for i, ch := range waiting {
		stillBlocked(t, ch, fmt.Sprintf("locking queue %d held by m-a", i))
	}
	stillBlocked(t, waitingA, "m-a locking queue 2 held by m-b")

	s.f.Expire(c, gOrders, "m-a")
	for i, ch := range waiting {
		r := awaitLock(t, w, ch, fmt.Sprintf("Lock of queue %d after its holder expired", i))
		// Checked before anything else: Lost must have fired already.
		lost := isClosed(la[i].Lost())
		must(t, r.err, fmt.Sprintf("Lock of queue %d after its holder expired", i))
		if !lost {
			t.Fatalf("another session's Lock of queue %d returned before Lost of the expired holder's lease was closed: two holders for a while", i)
		}
		if r.l.Token() <= la[i].Token() {
			t.Fatalf("token %d after the holder expired is not larger than the expired lease's %d", r.l.Token(), la[i].Token())
		}
	}
	awaitClosed(t, w, a.Done(), "Done of the expired session")
	for i, l := range la {
		if !isClosed(l.Lost()) {
			t.Fatalf("Done of the expired session was closed before Lost of its lease %d: every lease of the session is lost by the time Done is closed (Session.Done)", i)
		}
	}
	rA := awaitLock(t, w, waitingA, "m-a's waiting Lock after m-a expired")
	wantErr(t, rA.err, ferry.ErrSessionExpired, "a Lock waiting in a session that expired")
	_, err := a.Lock(w.ctx, 3)
	wantErr(t, err, ferry.ErrSessionExpired, "Lock in an expired session")
	waitMembers(t, w, b, "m-b after m-a expired", "m-b", "m-c")
	waitMembers(t, w, m, "m-c after m-a expired", "m-b", "m-c")
	eventuallyMembers(t, w, c, gOrders, "after m-a expired", "m-b", "m-c")
	for i, l := range la {
		must(t, l.Release(w.ctx), fmt.Sprintf("Release of lost lease %d", i))
	}
	must(t, a.Leave(w.ctx), "Leave of an expired session")

	if isClosed(o.Done()) || isClosed(lo.Lost()) || isClosed(lb.Lost()) {
		t.Fatal("the expiry of m-a in one group ended a session or lease of another member or group")
	}
	a = joinC(t, w, c, gOrders, "m-a") // joins again
	waitMembers(t, w, b, "m-b after m-a joined again", "m-a", "m-b", "m-c")
	release(t, w, lb, "m-b's lease of queue 2")
	lockQ(t, w, a, "m-a joined again", 2)
}

func (s *coordSuite) concurrentLocks(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	const members, rounds = 8, 25
	var (
		holders atomic.Int32
		mu      sync.Mutex // guards order
		order   []uint64   // tokens in the order the lock was taken
		errs    = make([]error, members)
		wg      sync.WaitGroup
	)
	sessions := make([]ferry.Session, members)
	for i := range sessions {
		sessions[i] = joinC(t, w, c, gOrders, "m-"+strconv.Itoa(i))
	}
	for i, sess := range sessions {
		wg.Go(func() {
			for r := range rounds {
				l, err := sess.Lock(w.ctx, 0)
				if err != nil {
					errs[i] = fmt.Errorf("Lock %d of member %d: %w", r, i, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					errs[i] = fmt.Errorf("%d holders of one lock at once (member %d, token %d)", n, i, l.Token())
				}
				mu.Lock()
				order = append(order, l.Token())
				mu.Unlock()
				holders.Add(-1)
				if err := l.Release(w.ctx); err != nil {
					errs[i] = fmt.Errorf("Release %d of member %d: %w", r, i, err)
					return
				}
				if errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...), "concurrent Lock and Release")
	if len(order) != members*rounds {
		t.Fatalf("%d locks taken, want %d", len(order), members*rounds)
	}
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("token %d taken after token %d: tokens do not grow in the order the lock was taken (%v)", order[i], order[i-1], order)
		}
	}
}

func (s *coordSuite) concurrentMembership(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	const members = 8
	watcher := joinC(t, w, c, gOrders, "watcher")
	waitMembers(t, w, watcher, "watcher", "watcher")
	errs := make([]error, members)
	var wg sync.WaitGroup
	for i := range members {
		wg.Go(func() {
			name := "m-" + strconv.Itoa(i)
			for range 3 {
				sess, err := c.Join(w.ctx, gOrders, name)
				if err != nil {
					errs[i] = err
					return
				}
				if !slices.Contains(sess.Members(), name) {
					select {
					case <-sess.Changed():
					case <-w.ctx.Done():
						errs[i] = fmt.Errorf("%s: no Changed after Join", name)
						return
					}
				}
				if err := sess.Leave(w.ctx); err != nil {
					errs[i] = err
					return
				}
			}
			_, errs[i] = c.Join(w.ctx, gOrders, name)
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...), "concurrent Join and Leave")
	want := []string{"watcher"}
	for i := range members {
		want = append(want, "m-"+strconv.Itoa(i))
	}
	slices.Sort(want)
	wantMembers(t, w, c, gOrders, want...)
	waitMembers(t, w, watcher, "watcher after the others joined and left", want...)
}

func (s *coordSuite) peers(t *testing.T, w *watchdog) {
	if s.f.Peer == nil {
		t.Skip("ferrytest: CoordinatorFeatures.Peer not set: no second coordinator over the same groups")
	}
	c := s.openC(t, w)
	p := s.f.Peer(t, c)
	if p == nil {
		t.Fatal("ferrytest: CoordinatorFeatures.Peer returned nil")
	}
	w.closeOnHang(p)
	t.Cleanup(func() { _ = p.Close() })

	a := joinC(t, w, c, gOrders, "m-a")
	wantListed(t, w, c, gOrders, "m-a", true, "m-a joined through the first")
	b := joinC(t, w, p, gOrders, "m-b")
	wantListed(t, w, p, gOrders, "m-b", true, "m-b joined through the peer")
	waitMembers(t, w, a, "m-a after m-b joined through the peer", "m-a", "m-b")
	waitMembers(t, w, b, "m-b (through the peer) after its Join", "m-a", "m-b")
	eventuallyMembers(t, w, c, gOrders, "the first after m-b joined through the peer", "m-a", "m-b")
	eventuallyMembers(t, w, p, gOrders, "the peer after m-a joined through the first", "m-a", "m-b")

	// A lock taken through one coordinator holds in the other.
	la := lockQ(t, w, a, "m-a", 0)
	ch := goLock(t, w, w.ctx, b, 0)
	stillBlocked(t, ch, "m-b (through the peer) locking queue 0 held by m-a")
	release(t, w, la, "m-a's lease")
	r := awaitLock(t, w, ch, "m-b (through the peer) locking queue 0 after m-a released it")
	must(t, r.err, "Lock of queue 0 through the peer after m-a released it")
	if r.l.Token() <= la.Token() {
		t.Fatalf("token %d of a Lock through the peer is not larger than the earlier holder's %d", r.l.Token(), la.Token())
	}

	must(t, b.Leave(w.ctx), "Leave of m-b through the peer")
	wantListed(t, w, p, gOrders, "m-b", false, "m-b left through the peer")
	waitMembers(t, w, a, "m-a after m-b left through the peer", "m-a")
	eventuallyMembers(t, w, c, gOrders, "the first after m-b left through the peer", "m-a")
	must(t, a.Leave(w.ctx), "Leave of m-a")
	wantMembers(t, w, c, gOrders)
	eventuallyMembers(t, w, p, gOrders, "the peer after both left")
}
