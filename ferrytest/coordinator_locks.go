package ferrytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// The suite's cases of queue locks: exclusion, cancellation, independence
// of queues and groups, and fencing tokens.

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
