package ferrytest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/ferrymq/ferry"
)

// FakeCoordinator is a [ferry.Coordinator] for tests that can make what a
// distributed coordinator suffers happen on demand: a member's session
// expiring ([FakeCoordinator.Expire]), as when its process goes silent
// for the time to live, and a single lease lost
// ([FakeCoordinator.LoseLease]), as when a renewal fails, and a member
// unable to join ([FakeCoordinator.FailJoins]). It tells who
// holds what ([FakeCoordinator.Holder], [FakeCoordinator.Sessions]).
// Without faults it behaves as [ferry.MemoryCoordinator], which it wraps,
// and passes [TestCoordinator] with the Expire feature.
//
// Pass it to the brokers under test with [ferry.WithCoordinator]; brokers
// sharing it (and a storage and cursor store) split the queues of a
// group as brokers in several processes would. The caller owns it: close
// the brokers first, then it. It starts no goroutines and is safe for
// concurrent use.
type FakeCoordinator struct {
	inner *ferry.MemoryCoordinator

	mu        sync.Mutex // guards sessions, leases, failJoins and closed; held over calls to inner
	sessions  map[ferry.GroupKey]map[string]*fakeSession
	leases    map[fakeLockKey]*fakeLease
	failJoins map[fakeMemberKey]error
	closed    bool
}

type fakeMemberKey struct {
	g      ferry.GroupKey
	member string
}

var (
	_ ferry.Coordinator = (*FakeCoordinator)(nil)
	_ ferry.Session     = (*fakeSession)(nil)
	_ ferry.Lease       = (*fakeLease)(nil)
)

type fakeLockKey struct {
	g ferry.GroupKey
	q int
}

// NewFakeCoordinator returns an empty fake coordinator.
func NewFakeCoordinator() *FakeCoordinator {
	return &FakeCoordinator{
		inner:     ferry.NewMemoryCoordinator(),
		sessions:  map[ferry.GroupKey]map[string]*fakeSession{},
		leases:    map[fakeLockKey]*fakeLease{},
		failJoins: map[fakeMemberKey]error{},
	}
}

// Join implements [ferry.Coordinator].
func (c *FakeCoordinator) Join(ctx context.Context, g ferry.GroupKey, member string) (ferry.Session, error) {
	if err := checkContext(ctx); err != nil {
		return nil, fmt.Errorf("ferrytest: join %s: %w", g, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, &ferry.Error{Op: fmt.Sprintf("ferrytest: join %s", g), Err: ferry.ErrClosed}
	}
	if err := c.failJoins[fakeMemberKey{g, member}]; err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("ferrytest: join %s as %q", g, member), Err: err}
	}
	in, err := c.inner.Join(ctx, g, member)
	if err != nil {
		return nil, err
	}
	s := &fakeSession{c: c, g: g, member: member, inner: in, leases: map[int]*fakeLease{}}
	if c.sessions[g] == nil {
		c.sessions[g] = map[string]*fakeSession{}
	}
	c.sessions[g][member] = s
	return s, nil
}

// Members implements [ferry.Coordinator].
func (c *FakeCoordinator) Members(ctx context.Context, g ferry.GroupKey) ([]string, error) {
	if err := checkContext(ctx); err != nil {
		return nil, fmt.Errorf("ferrytest: members of %s: %w", g, err)
	}
	return c.inner.Members(ctx, g)
}

// Close implements [io.Closer]: every lease is lost, then every session
// ends. Idempotent.
func (c *FakeCoordinator) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, ms := range c.sessions {
		for _, s := range ms {
			s.endLocked(true)
		}
	}
	return c.inner.Close()
}

// Expire ends member's session of group g as if the member had gone
// silent for the time to live: each of its leases is lost (Lost closed)
// first, then its locks are freed, then the session ends (Done closed)
// and the other members are told. The member may join again. It reports
// whether the member had a live session.
func (c *FakeCoordinator) Expire(g ferry.GroupKey, member string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[g][member]
	if s == nil {
		return false
	}
	s.endLocked(true)
	_ = s.inner.Leave(context.Background())
	return true
}

// FailJoins makes every later Join of member to group g fail with err,
// wrapped, as when the member cannot reach a distributed coordinator; a
// nil err lets it join again. With [FakeCoordinator.Expire] it keeps an
// expired member out of its group for as long as a test needs.
func (c *FakeCoordinator) FailJoins(g ferry.GroupKey, member string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		delete(c.failJoins, fakeMemberKey{g, member})
		return
	}
	c.failJoins[fakeMemberKey{g, member}] = err
}

// LoseLease makes the lease that holds queue of group g lost, as when a
// distributed coordinator fails to renew it: its Lost is closed, then the
// lock is freed for the next Lock. The holder's session lives on. It
// reports whether the queue was held.
func (c *FakeCoordinator) LoseLease(g ferry.GroupKey, queue int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leases[fakeLockKey{g, queue}]
	if l == nil {
		return false
	}
	l.freeLocked(true)
	_ = l.inner.Release(context.Background())
	return true
}

// Holder returns the member that holds the lock of queue in group g and
// its lease's token; ok is false when nobody holds it.
func (c *FakeCoordinator) Holder(g ferry.GroupKey, queue int) (member string, token uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leases[fakeLockKey{g, queue}]
	if l == nil {
		return "", 0, false
	}
	return l.s.member, l.inner.Token(), true
}

// FakeSessionInfo describes a live session of a [FakeCoordinator].
type FakeSessionInfo struct {
	Group  ferry.GroupKey
	Member string
	// Queues are the queues whose lock the session holds, sorted.
	Queues []int
}

// Sessions returns the live sessions, sorted by scope, topic and member.
// The caller owns the result.
func (c *FakeCoordinator) Sessions() []FakeSessionInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []FakeSessionInfo
	for g, ms := range c.sessions {
		for m, s := range ms {
			qs := make([]int, 0, len(s.leases))
			for q := range s.leases {
				qs = append(qs, q)
			}
			slices.Sort(qs)
			out = append(out, FakeSessionInfo{Group: g, Member: m, Queues: qs})
		}
	}
	slices.SortFunc(out, func(a, b FakeSessionInfo) int {
		return cmp.Or(cmp.Compare(a.Group.Scope, b.Group.Scope), cmp.Compare(a.Group.Topic, b.Group.Topic), cmp.Compare(a.Member, b.Member))
	})
	return out
}

// fakeSession is a session of a FakeCoordinator: the memory
// coordinator's, with leases the fake can lose.
type fakeSession struct {
	c      *FakeCoordinator
	g      ferry.GroupKey
	member string
	inner  ferry.Session

	leases map[int]*fakeLease // guarded by c.mu
	ended  bool               // guarded by c.mu
}

func (s *fakeSession) Changed() <-chan struct{} { return s.inner.Changed() }
func (s *fakeSession) Members() []string        { return s.inner.Members() }
func (s *fakeSession) Done() <-chan struct{}    { return s.inner.Done() }

func (s *fakeSession) Lock(ctx context.Context, queue int) (ferry.Lease, error) {
	if err := checkContext(ctx); err != nil {
		return nil, fmt.Errorf("ferrytest: lock %s queue %d: %w", s.g, queue, err)
	}
	in, err := s.inner.Lock(ctx, queue)
	if err != nil {
		return nil, err
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.ended {
		// Expired or closed while the lock was taken: it is freed.
		_ = in.Release(context.Background())
		return nil, &ferry.Error{Op: fmt.Sprintf("ferrytest: lock %s queue %d", s.g, queue), Err: ferry.ErrSessionExpired}
	}
	l := &fakeLease{s: s, q: queue, inner: in, lost: make(chan struct{})}
	s.leases[queue] = l
	s.c.leases[fakeLockKey{s.g, queue}] = l
	return l, nil
}

func (s *fakeSession) Leave(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return fmt.Errorf("ferrytest: leave %s: %w", s.g, err)
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.endLocked(true) // a lease not released is lost when its session ends
	return s.inner.Leave(ctx)
}

// endLocked forgets the session and its leases, losing them if lost;
// the caller then ends the inner session, which frees the locks.
// c.mu held.
func (s *fakeSession) endLocked(lost bool) {
	if s.ended {
		return
	}
	s.ended = true
	for _, l := range s.leases {
		l.freeLocked(lost)
	}
	if ms := s.c.sessions[s.g]; ms[s.member] == s {
		delete(ms, s.member)
		if len(ms) == 0 {
			delete(s.c.sessions, s.g)
		}
	}
}

// fakeLease is a lease of a FakeCoordinator.
type fakeLease struct {
	s     *fakeSession
	q     int
	inner ferry.Lease
	lost  chan struct{}

	gone bool // guarded by s.c.mu: released or lost
}

func (l *fakeLease) Token() uint64         { return l.inner.Token() }
func (l *fakeLease) Lost() <-chan struct{} { return l.lost }

func (l *fakeLease) Release(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return fmt.Errorf("ferrytest: release %s queue %d: %w", l.s.g, l.q, err)
	}
	l.s.c.mu.Lock()
	defer l.s.c.mu.Unlock()
	if l.gone {
		return nil
	}
	l.freeLocked(false)
	return l.inner.Release(ctx)
}

// freeLocked forgets the lease, closing Lost first if lost; the caller
// then frees the inner lock. s.c.mu held.
func (l *fakeLease) freeLocked(lost bool) {
	if l.gone {
		return
	}
	l.gone = true
	if lost {
		close(l.lost)
	}
	k := fakeLockKey{l.s.g, l.q}
	if l.s.c.leases[k] == l {
		delete(l.s.c.leases, k)
	}
	delete(l.s.leases, l.q)
}
