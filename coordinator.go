package ferry

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// GroupKey names a group of members sharing the queues of one topic.
type GroupKey struct {
	// Scope is the consumer group, or "<group>@<member>" for a broadcast
	// member (see [Broadcast]), whose cursors are its own.
	Scope string
	// Topic is the topic the group reads.
	Topic string
}

func (g GroupKey) String() string { return g.Scope + "/" + g.Topic }

// Coordinator keeps consumer group membership and the per-(group, queue)
// locks that give each queue one owner. It is the one seam between a
// consumer and everything that knows about the other members: the
// in-memory default ([NewMemoryCoordinator]) serves the brokers of one
// process, a distributed one (a KV store with leases, say) serves
// brokers in many, and the consumer is the same over both. Nothing in a
// consumer assumes the other members live in its process.
//
// Failure detection is the implementation's: a member whose process goes
// silent for the implementation's time to live (TTL) is gone, its
// session ends ([Session.Done]) and every [Lease] it held is lost
// ([Lease.Lost]) before anyone else can lock that queue. The in-memory
// coordinator has no TTL: its members live in the process and leave
// explicitly.
//
// Implementations must be safe for concurrent use. After Close, Join and
// Members return [ErrClosed] and every session ends; Close is
// idempotent. A nil ctx, here and in the methods of [Session] and
// [Lease], is [ErrInvalidOption] and changes nothing. Package ferrytest holds the conformance suite
// (TestCoordinator) and a fake that expires sessions and leases on demand.
type Coordinator interface {
	// Join adds member to group g and returns its session; every session
	// of the group is told ([Session.Changed]). A member already live in
	// the group, an empty scope or member is [ErrInvalidOption]; an
	// invalid topic name [ErrInvalidTopic]. ctx bounds the call.
	Join(ctx context.Context, g GroupKey, member string) (Session, error)
	// Members returns g's live members, sorted; none for a group nobody
	// joined. It reads the coordinator's own writes: once a Join through
	// it has returned, Members lists the member, and once that session's
	// Leave has returned nil, Members does not (until it joins again).
	// Other changes — a Join or Leave through another coordinator sharing
	// the groups (another broker's), an expiry — show eventually, within
	// the implementation's propagation delay (see its doc), as they do in
	// [Session.Members].
	Members(ctx context.Context, g GroupKey) ([]string, error)
	io.Closer
}

// Session is one member's membership of a group, from [Coordinator.Join]
// to [Session.Leave] or its expiry. Its methods are safe for concurrent
// use.
type Session interface {
	// Changed has a value after every membership change of the group
	// (coalesced: several changes may give one value), starting with one
	// right after Join. Read [Session.Members] after each.
	Changed() <-chan struct{}
	// Members returns the group's members, sorted, as last seen; self is
	// among them while the session lives.
	Members() []string
	// Done is closed when the session ends: left, expired (the member was
	// silent for the TTL) or the coordinator closed. Every lease of the
	// session is lost by then.
	Done() <-chan struct{}
	// Lock takes the lock of queue in the group for this session, waiting
	// without polling until it is free or ctx is done (ctx's error). After
	// the session ended it is [ErrSessionExpired]; a queue out of range
	// for the implementation is [ErrInvalidOption]. A session must not
	// lock a queue it holds.
	Lock(ctx context.Context, queue int) (Lease, error)
	// Leave ends the session: every lease it did not release is lost
	// (Lost closed, before anyone else can lock its queue, as for any
	// session that ends) and its lock freed, and the others are told.
	// Leaving twice, or after expiry, is a no-op. The session ends even
	// when Leave returns an error; the error says that the others may not
	// have been told, and see the member go only when its session expires
	// (see [Coordinator.Members]).
	Leave(ctx context.Context) error
}

// Lease is the holding of one queue's lock, from [Session.Lock] to
// Release or its loss.
type Lease interface {
	// Token is the lease's fencing token: strictly larger than that of
	// every earlier Lock of the same (group, queue), in any session.
	// Commits made under the lease carry it (see [FencedCursorStore]).
	Token() uint64
	// Lost is closed when the lease is lost without Release: the session
	// expired or ended, or the implementation could not renew it. It is
	// closed before anyone else can lock the queue. The holder must stop
	// at once: fetch nothing more, cancel its handlers and commit nothing
	// more (its token is stale, so a fenced store would refuse it).
	Lost() <-chan struct{}
	// Release gives the lock up if the lease still holds it; otherwise it
	// does nothing. Idempotent.
	Release(ctx context.Context) error
}

// DeadlineLease is a [Lease] that knows, by its holder's own clock, when
// it may have expired: a lease renewed by heartbeats (natsstore's) counts
// itself lost at its last confirmed renewal plus its TTL, minus a safety
// margin. Its holder starts no work on the queue after the deadline, even
// before Lost is closed: a process paused past its TTL (SIGSTOP, a long
// GC, a stalled VM) wakes with its timers not yet run, and must not hand
// a message the group has moved on to its handler. Optional: a lease
// that cannot expire (MemoryCoordinator's) need not implement it.
type DeadlineLease interface {
	Lease
	// Deadline returns the time after which the lease may have expired,
	// and ok; ok is false while it has no deadline. It grows with each
	// renewal. Safe for concurrent use.
	Deadline() (deadline time.Time, ok bool)
}

// MemoryCoordinator is the in-memory [Coordinator], the default: it
// serves every broker of the process it is shared by (see
// [WithCoordinator]). Its sessions end only by Leave or Close. A change
// shows at once: by the time Join or Leave returns, Members and every
// session's Members show it and the sessions have their Changed value.
// Its lease tokens follow the wall clock (see [Lease.Token]), so a
// process started again gives larger tokens than it did before, and a
// fenced cursor store that keeps tokens across restarts (filestore,
// sqlstore) takes its commits.
type MemoryCoordinator struct {
	mu     sync.Mutex // guards every field below
	groups map[GroupKey][]*memSession
	locks  map[lockKey]*memLease
	tokens map[lockKey]uint64 // the last token given per lock
	closed bool
	// calls are the consumers' callbacks (a session's event, a lease's
	// loss) due since the lock was taken: unlock makes them once it has
	// let the lock go, so that no consumer code runs in it.
	calls []func()
}

// unlock unlocks c.mu, then makes the callbacks queued under it.
func (c *MemoryCoordinator) unlock() {
	calls := c.calls
	c.calls = nil
	c.mu.Unlock()
	for i, f := range calls {
		f()
		calls[i] = nil
	}
}

var (
	_ Coordinator = (*MemoryCoordinator)(nil)
	_ Session     = (*memSession)(nil)
	_ Lease       = (*memLease)(nil)
)

type lockKey struct {
	g GroupKey
	q int
}

// NewMemoryCoordinator returns an empty coordinator.
func NewMemoryCoordinator() *MemoryCoordinator {
	return &MemoryCoordinator{
		groups: map[GroupKey][]*memSession{},
		locks:  map[lockKey]*memLease{},
		tokens: map[lockKey]uint64{},
	}
}

// validateJoin checks what Join takes.
func validateJoin(g GroupKey, member string) error {
	if g.Scope == "" || member == "" {
		return fmt.Errorf("%w: empty group or member", ErrInvalidOption)
	}
	if err := ValidateTopicName(g.Topic); err != nil {
		return err
	}
	return nil
}

// Join implements [Coordinator].
func (c *MemoryCoordinator) Join(ctx context.Context, g GroupKey, member string) (Session, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: fmt.Sprintf("join %s", g), Err: err}
	}
	if err := validateJoin(g, member); err != nil {
		return nil, &Error{Op: fmt.Sprintf("join %s", g), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: fmt.Sprintf("join %s", g), Err: err}
	}
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		return nil, &Error{Op: fmt.Sprintf("join %s", g), Err: ErrClosed}
	}
	if slices.ContainsFunc(c.groups[g], func(s *memSession) bool { return s.member == member }) {
		return nil, &Error{Op: "join", Err: fmt.Errorf("%w: member %q already in group %q of topic %q", ErrInvalidOption, member, g.Scope, g.Topic)}
	}
	s := &memSession{c: c, g: g, member: member, changed: make(chan struct{}, 1), done: make(chan struct{})}
	c.groups[g] = append(c.groups[g], s)
	c.notifyLocked(g)
	return s, nil
}

// notifyLocked tells every session of g that membership changed.
func (c *MemoryCoordinator) notifyLocked(g GroupKey) {
	members := c.membersLocked(g)
	for _, s := range c.groups[g] {
		s.members.Store(&members)
		select {
		case s.changed <- struct{}{}:
		default: // a change is already pending
		}
		if s.onEvent != nil {
			c.calls = append(c.calls, s.onEvent)
		}
	}
}

// membersLocked returns the members of g, sorted. c.mu held.
func (c *MemoryCoordinator) membersLocked(g GroupKey) []string {
	ms := make([]string, len(c.groups[g]))
	for i, s := range c.groups[g] {
		ms[i] = s.member
	}
	slices.Sort(ms)
	return ms
}

func mapKeysOf[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Members implements [Coordinator].
func (c *MemoryCoordinator) Members(ctx context.Context, g GroupKey) ([]string, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: fmt.Sprintf("members of %s", g), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: fmt.Sprintf("members of %s", g), Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, &Error{Op: fmt.Sprintf("members of %s", g), Err: ErrClosed}
	}
	return c.membersLocked(g), nil
}

// Close implements [io.Closer]: every session ends, every lease is lost.
func (c *MemoryCoordinator) Close() error {
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, ms := range c.groups {
		for _, s := range slices.Clone(ms) { // each unlists itself
			s.endLocked()
		}
	}
	return nil
}

// memSession is a session of the memory coordinator.
type memSession struct {
	c       *MemoryCoordinator
	g       GroupKey
	member  string
	changed chan struct{}
	done    chan struct{}
	members atomicSlice

	leases  []*memLease // guarded by c.mu
	ended   bool        // guarded by c.mu
	onEvent func()      // guarded by c.mu: see notify
}

// notify implements sessionNotifier.
func (s *memSession) notify(f func()) bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.ended {
		return false
	}
	s.onEvent = f
	return true
}

func (s *memSession) Changed() <-chan struct{} { return s.changed }
func (s *memSession) Done() <-chan struct{}    { return s.done }

func (s *memSession) Members() []string {
	if p := s.members.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

func (s *memSession) Lock(ctx context.Context, queue int) (Lease, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: fmt.Sprintf("lock %s queue %d", s.g, queue), Err: err}
	}
	if queue < 0 || queue >= MaxQueues {
		return nil, &Error{Op: fmt.Sprintf("lock %s queue %d", s.g, queue), Err: fmt.Errorf("%w: out of range", ErrInvalidOption)}
	}
	k := lockKey{s.g, queue}
	for {
		s.c.mu.Lock()
		if s.ended {
			s.c.mu.Unlock()
			return nil, &Error{Op: fmt.Sprintf("lock %s queue %d", s.g, queue), Err: ErrSessionExpired}
		}
		l := s.c.locks[k]
		if l == nil {
			l = s.grantLocked(k)
			s.c.mu.Unlock()
			return l, nil
		}
		freed := l.freedLocked()
		s.c.mu.Unlock()
		select {
		case <-freed:
		case <-s.done:
		case <-ctx.Done():
			return nil, &Error{Op: fmt.Sprintf("lock %s queue %d", s.g, queue), Err: ctx.Err()}
		}
	}
}

// grantLocked gives s the free lock k. s.c.mu held. Tokens follow the
// wall clock (in nanoseconds, one more than the last when that is later),
// so that a process started again, with a new coordinator, gives larger
// tokens than the one before did: a store that keeps the tokens it saw
// (a fenced cursor store on disk or in a database) does not fence it out.
func (s *memSession) grantLocked(k lockKey) *memLease {
	s.c.tokens[k] = max(s.c.tokens[k]+1, uint64(time.Now().UnixNano()))
	l := &memLease{s: s, k: k, token: s.c.tokens[k]}
	s.c.locks[k] = l
	s.leases = append(s.leases, l)
	return l
}

// tryLock implements lockTrier.
func (s *memSession) tryLock(queue int) Lease {
	if queue < 0 || queue >= MaxQueues {
		return nil
	}
	k := lockKey{s.g, queue}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.ended || s.c.locks[k] != nil {
		return nil
	}
	return s.grantLocked(k)
}

// lockTrier is implemented by the sessions of this package's
// coordinator: tryLock is Lock without waiting, nil when Lock would wait
// or fail (Lock then tells why).
type lockTrier interface {
	tryLock(queue int) Lease
}

func (s *memSession) Leave(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: fmt.Sprintf("leave %s", s.g), Err: err}
	}
	s.c.mu.Lock()
	defer s.c.unlock()
	s.endLocked()
	return nil
}

// endLocked ends the session: its leases are lost (Lost closed before
// their locks are freed), the group is told, then Done is closed.
// s.c.mu held.
func (s *memSession) endLocked() {
	if s.ended {
		return
	}
	s.ended = true
	for len(s.leases) > 0 {
		s.leases[len(s.leases)-1].freeLocked(true) // it unlists itself
	}
	if ms := s.c.groups[s.g]; slices.Contains(ms, s) {
		if ms = slices.DeleteFunc(ms, func(o *memSession) bool { return o == s }); len(ms) == 0 {
			delete(s.c.groups, s.g)
		} else {
			s.c.groups[s.g] = ms
		}
		s.c.notifyLocked(s.g)
	}
	close(s.done)
	if s.onEvent != nil {
		s.c.calls = append(s.c.calls, s.onEvent)
	}
}

// memLease is a lease of the memory coordinator.
type memLease struct {
	s     *memSession
	k     lockKey
	token uint64
	// lost and freed are made when first asked for: a consumer of this
	// package watches a lease through afterLost, and nobody waits for a
	// free lock's release. Guarded by s.c.mu.
	lost  chan struct{} // closed when lost
	freed chan struct{} // closed when released or lost: waiters retry

	gone    bool   // guarded by s.c.mu
	wasLost bool   // guarded by s.c.mu
	onLost  func() // guarded by s.c.mu: called once, when lost
}

// closedChan is a closed channel, for a lease lost before Lost was asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (l *memLease) Token() uint64 { return l.token }

func (l *memLease) Lost() <-chan struct{} {
	l.s.c.mu.Lock()
	defer l.s.c.mu.Unlock()
	if l.lost == nil {
		if l.wasLost {
			return closedChan
		}
		l.lost = make(chan struct{})
	}
	return l.lost
}

// freedLocked returns the channel closed when l is released or lost.
// s.c.mu held.
func (l *memLease) freedLocked() chan struct{} {
	if l.freed == nil {
		if l.gone {
			return closedChan
		}
		l.freed = make(chan struct{})
	}
	return l.freed
}

func (l *memLease) Release(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: fmt.Sprintf("release %s queue %d", l.k.g, l.k.q), Err: err}
	}
	l.s.c.mu.Lock()
	defer l.s.c.mu.Unlock()
	l.freeLocked(false)
	return nil
}

// freeLocked gives the lock up, firing Lost first when lost. s.c.mu held.
func (l *memLease) freeLocked(lost bool) {
	if l.gone {
		return
	}
	l.gone = true
	if lost {
		l.wasLost = true
		if l.lost != nil {
			close(l.lost)
		}
		if l.onLost != nil {
			l.s.c.calls = append(l.s.c.calls, l.onLost)
		}
	}
	c := l.s.c
	if c.locks[l.k] == l {
		delete(c.locks, l.k)
	}
	if i := slices.Index(l.s.leases, l); i >= 0 {
		l.s.leases = slices.Delete(l.s.leases, i, i+1)
	}
	if l.freed != nil {
		close(l.freed)
	}
}

// afterLost arranges for f to be called when the lease is lost, so that
// a consumer needs no goroutine per lease to watch Lost: f is called
// once the coordinator has let its lock go (see unlock), in the goroutine
// whose call lost the lease, and must not block. It reports false,
// calling nothing, if the lease is gone already.
func (l *memLease) afterLost(f func()) bool {
	l.s.c.mu.Lock()
	defer l.s.c.mu.Unlock()
	if l.gone {
		return false
	}
	l.onLost = f
	return true
}

// lostNotifier is implemented by the leases of this package's
// coordinator (an unexported method: no other package's lease can): they
// call f when lost, so that the consumer watches them without a goroutine
// each; other leases are watched by a goroutine on Lost.
type lostNotifier interface {
	afterLost(f func()) bool
}

// sessionNotifier is implemented by the sessions of this package's
// coordinator: notify arranges for f to be called after every membership
// change and when the session ends, so that a consumer follows its
// membership with no goroutine waiting on Changed and Done. f is called
// once the coordinator has let its lock go (see unlock), in the goroutine
// whose call made the change: it must not block. notify reports false,
// arranging nothing, if the session has ended.
type sessionNotifier interface {
	notify(f func()) bool
}

// atomicSlice holds a sorted member list, replaced whole.
type atomicSlice = atomic.Pointer[[]string]
