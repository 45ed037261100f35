package ferrytest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// TestCoordinator must fail on a coordinator broken in any way its
// contract forbids. As in TestSuitesCatchBrokenImplementations, each case
// runs the suite in a child process over a coordinator broken one way
// (brokenCoord, a FakeCoordinator wrapped) and checks that it fails and
// says why; the control, the same wrapper unbroken, must pass.

const brokenCoordEnv = "FERRYTEST_BROKEN_COORD"

type brokenCoordCase struct {
	// subtests restricts the child to the suite's subtests that catch
	// the defect (a -test.run pattern below the test), for a defect that
	// makes the others merely slow; "" runs the whole suite.
	subtests string
	timeout  time.Duration
	want     string // in the child's output; "" for the control, which must pass
}

var brokenCoordCases = map[string]brokenCoordCase{
	"":              {},
	"two-holders":   {want: "two holders"},
	"token-static":  {want: "is not larger than"},
	"lost-late":     {want: "returned before Lost of the expired holder's lease was closed"},
	"missed-change": {timeout: 300 * time.Millisecond, want: "no value on Changed after a membership change"},
	"polling":       {subtests: "Wake", want: "not woken (polling?)"},
	// The negative controls of issue 32: each breaks one promise that
	// the suite did not check before.
	"queue-in-a-byte":     {subtests: "LockIndependent", timeout: 2 * time.Second, want: "the two queues share a lock"},
	"polling-100ms":       {subtests: "Wake", want: "not woken (polling?); want at most"},
	"lost-after-done":     {subtests: "Close", want: "before Lost of its lease"},
	"token-at-wait-start": {subtests: "TokenOrder", want: "tokens must grow in the order the lock is granted"},
	"leave-not-lost":      {subtests: "Leave", want: "returned before Lost of the lease m-a held when it left was closed"},
	"stale-members":       {subtests: "Membership", want: "must read its own Joins and Leaves"},
}

func TestCoordinatorSuiteCatchesBrokenCoordinators(t *testing.T) {
	if mode, ok := os.LookupEnv(brokenCoordEnv); ok {
		c := brokenCoordCases[mode]
		ferrytest.TestCoordinator(t, ferrytest.CoordinatorFeatures{
			Expire:  func(c ferry.Coordinator, g ferry.GroupKey, m string) { c.(*brokenCoord).fake.Expire(g, m) },
			Peer:    func(t *testing.T, c ferry.Coordinator) ferry.Coordinator { return c },
			Timeout: c.timeout,
		}, func(t *testing.T) ferry.Coordinator { return newBrokenCoord(mode) })
		return
	}
	for mode, c := range brokenCoordCases {
		name := mode
		if name == "" {
			name = "control"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pattern := "^TestCoordinatorSuiteCatchesBrokenCoordinators$"
			if c.subtests != "" {
				pattern += "/^" + c.subtests + "$"
			}
			cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenCoordEnv+"="+mode)
			out, err := cmd.CombinedOutput()
			if c.want == "" {
				require.NoError(t, err, "the control must pass:\n%s", out)
				require.Contains(t, string(out), "--- PASS: TestCoordinatorSuiteCatchesBrokenCoordinators/Expiry")
				return
			}
			require.Error(t, err, "the suite passed a coordinator broken by %s:\n%s", mode, out)
			require.Contains(t, string(out), c.want)
		})
	}
}

// brokenCoord is a FakeCoordinator broken in the way mode says:
//
//   - two-holders: each session locks in a group of its own, so nobody
//     waits for anybody.
//   - token-static: every lease's token is 1.
//   - lost-late: a lost lease's Lost is closed only a while after the
//     next holder's Lock returned.
//   - missed-change: Changed has the value after Join, and no other.
//   - polling: a Lock of a held queue tries again every 2 s instead of
//     being woken.
//   - queue-in-a-byte: locks are keyed by the low byte of the queue
//     index, so queues 0 and 256 share one.
//   - polling-100ms: a Lock of a held queue tries again every 100 ms.
//   - lost-after-done: a lost lease's Lost is closed 50 ms after its
//     session's Done.
//   - token-at-wait-start: a lease's token is drawn when its Lock
//     starts, not when it is granted.
//   - leave-not-lost: the leases a session holds when it leaves are
//     freed without their Lost being closed.
//   - lost-never: a lease's Lost is never closed (for TestConsumers).
//   - stale-members: Members answers what the call before it (for the
//     same group) found, as a coordinator reading a view one change
//     behind its own writes would.
type brokenCoord struct {
	ferry.Coordinator
	fake *ferrytest.FakeCoordinator
	mode string

	mu      sync.Mutex // guards next, drawn and seen
	next    map[lockKey]chan struct{}
	drawn   map[lockKey]uint64          // token-at-wait-start: the last token drawn
	seen    map[ferry.GroupKey][]string // stale-members: the last answer
	closing chan struct{}
	close   sync.Once
	wg      sync.WaitGroup // the lost-late and leave-not-lost goroutines
	late    sync.WaitGroup // the lost-after-done goroutines: not waited for
}

type lockKey struct {
	g ferry.GroupKey
	q int
}

func newBrokenCoord(mode string) *brokenCoord {
	f := ferrytest.NewFakeCoordinator()
	return &brokenCoord{Coordinator: f, fake: f, mode: mode, next: map[lockKey]chan struct{}{}, drawn: map[lockKey]uint64{}, seen: map[ferry.GroupKey][]string{}, closing: make(chan struct{})}
}

func (c *brokenCoord) Members(ctx context.Context, g ferry.GroupKey) ([]string, error) {
	ms, err := c.Coordinator.Members(ctx, g)
	if c.mode != "stale-members" || err != nil {
		return ms, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, ok := c.seen[g]
	c.seen[g] = ms
	if ok {
		return prev, nil
	}
	return ms, nil
}

func (c *brokenCoord) Join(ctx context.Context, g ferry.GroupKey, member string) (ferry.Session, error) {
	s, err := c.Coordinator.Join(ctx, g, member)
	if err != nil {
		return nil, err
	}
	bs := &brokenSession{Session: s, c: c, g: g, left: new(atomic.Bool)}
	switch c.mode {
	case "two-holders":
		bs.locks, err = c.Coordinator.Join(ctx, ferry.GroupKey{Scope: g.Scope + ".own." + member, Topic: g.Topic}, member)
		if err != nil {
			_ = s.Leave(ctx)
			return nil, err
		}
	case "missed-change":
		bs.changed = make(chan struct{}, 1)
		bs.changed <- struct{}{}
	}
	return bs, nil
}

func (c *brokenCoord) Close() error {
	c.close.Do(func() { close(c.closing) })
	err := c.Coordinator.Close()
	c.wg.Wait()
	return err
}

type brokenSession struct {
	ferry.Session
	c       *brokenCoord
	g       ferry.GroupKey
	locks   ferry.Session // two-holders: where this session locks
	changed chan struct{} // missed-change
	left    *atomic.Bool  // leave-not-lost: Leave was called
}

func (s *brokenSession) Changed() <-chan struct{} {
	if s.changed != nil {
		return s.changed
	}
	return s.Session.Changed()
}

func (s *brokenSession) Leave(ctx context.Context) error {
	s.left.Store(true)
	if s.locks != nil {
		_ = s.locks.Leave(ctx)
	}
	return s.Session.Leave(ctx)
}

func (s *brokenSession) Lock(ctx context.Context, q int) (ferry.Lease, error) {
	var l ferry.Lease
	var err error
	var drawn uint64
	switch s.c.mode {
	case "two-holders":
		l, err = s.locks.Lock(ctx, q)
	case "polling":
		l, err = s.poll(ctx, q, 2*time.Second)
	case "polling-100ms":
		l, err = s.poll(ctx, q, 100*time.Millisecond)
	case "queue-in-a-byte":
		lq := q
		if q >= 0 && q < ferry.MaxQueues {
			lq = q & 0xff
		}
		l, err = s.Session.Lock(ctx, lq)
	case "token-at-wait-start":
		s.c.mu.Lock()
		k := lockKey{s.g, q}
		s.c.drawn[k]++
		drawn = s.c.drawn[k]
		s.c.mu.Unlock()
		l, err = s.Session.Lock(ctx, q)
	default:
		l, err = s.Session.Lock(ctx, q)
	}
	if err != nil {
		return nil, err
	}
	if drawn != 0 {
		return drawnTokenLease{l, drawn}, nil
	}
	return s.c.wrap(s, q, l), nil
}

// poll tries to lock every interval.
func (s *brokenSession) poll(ctx context.Context, q int, interval time.Duration) (ferry.Lease, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		l, err := s.Session.Lock(tctx, q)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return l, err
		}
		t := time.NewTimer(interval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-s.Done():
			t.Stop()
		}
	}
}

func (c *brokenCoord) wrap(s *brokenSession, q int, l ferry.Lease) ferry.Lease {
	g := s.g
	switch c.mode {
	case "token-static":
		return staticTokenLease{l}
	case "lost-never":
		return neverLostLease{l}
	case "lost-after-done", "leave-not-lost":
		rl := &relayLease{Lease: l, lost: make(chan struct{}), released: make(chan struct{})}
		wg := &c.wg
		if c.mode == "lost-after-done" {
			wg = &c.late // Close must not wait for the late Lost, which would hide it
		}
		wg.Go(func() {
			select {
			case <-l.Lost():
			case <-rl.released:
				return
			}
			switch c.mode {
			case "leave-not-lost":
				if s.left.Load() {
					return // freed, never lost
				}
			case "lost-after-done":
				<-s.Done()
				time.Sleep(50 * time.Millisecond)
			}
			close(rl.lost)
		})
		return rl
	case "lost-late":
		c.mu.Lock()
		k := lockKey{g, q}
		if old := c.next[k]; old != nil {
			close(old) // this Lock is the next of the one before
		}
		next := make(chan struct{})
		c.next[k] = next
		c.mu.Unlock()
		ll := &lateLease{Lease: l, lost: make(chan struct{})}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer close(ll.lost)
			select {
			case <-l.Lost():
			case <-c.closing:
				return
			}
			select {
			case <-next:
			case <-c.closing:
				return
			}
			t := time.NewTimer(100 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-c.closing:
			}
		}()
		return ll
	}
	return l
}

// relayLease's Lost is closed by a goroutine of brokenCoord, after the
// Lost of the lease it wraps, as its mode says.
type relayLease struct {
	ferry.Lease
	lost     chan struct{}
	released chan struct{} // closed by the first Release: the goroutine ends
	once     sync.Once
}

func (l *relayLease) Lost() <-chan struct{} { return l.lost }

func (l *relayLease) Release(ctx context.Context) error {
	err := l.Lease.Release(ctx)
	if err == nil {
		l.once.Do(func() { close(l.released) })
	}
	return err
}

// drawnTokenLease has the token drawn when its Lock started.
type drawnTokenLease struct {
	ferry.Lease
	token uint64
}

func (l drawnTokenLease) Token() uint64 { return l.token }

// neverLostLease's Lost is never closed.
type neverLostLease struct{ ferry.Lease }

var never = make(chan struct{})

func (neverLostLease) Lost() <-chan struct{} { return never }

type staticTokenLease struct{ ferry.Lease }

func (staticTokenLease) Token() uint64 { return 1 }

type lateLease struct {
	ferry.Lease
	lost chan struct{}
}

func (l *lateLease) Lost() <-chan struct{} { return l.lost }
