package ferrytest

import (
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

// The suite's cases of sessions' lives: leaving, waking, closing, expiry,
// concurrency and peers.

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
