package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// coordinator keeps group membership and per-(group, queue) locks. It is the
// one seam between consumers and everything that knows about other
// members: a distributed implementation (a KV store with leases, say)
// replaces the in-memory one without the consumer changing. Nothing in a
// consumer assumes the other members live in its process.
//
// A group is named by scope (the consumer group, or "<group>@<member>" for
// a broadcast member) and topic. Implementations are safe for concurrent
// use.
type coordinator interface {
	// join adds member to the group. notify gets a value (sent without
	// blocking, so give it capacity 1) after every membership change,
	// starting with this join. A member already in the group is an error
	// wrapping ErrInvalidOption.
	join(g groupKey, member string, notify chan<- struct{}) error
	// leave removes member from the group and notifies the others.
	// Leaving twice is a no-op.
	leave(g groupKey, member string)
	// members returns the group's members, sorted.
	members(g groupKey) []string
	// lock takes the lock of queue q for the group on behalf of owner, a
	// token unique to one holding (member and run). It waits, without
	// polling, until the lock is free or ctx is done (ctx's error).
	lock(ctx context.Context, g groupKey, q int, owner string) error
	// unlock releases the lock if owner holds it; otherwise it does nothing.
	unlock(g groupKey, q int, owner string)
}

// groupKey names a group of members sharing the queues of one topic.
type groupKey struct {
	scope, topic string
}

// memCoordinator is the in-memory coordinator the broker owns.
type memCoordinator struct {
	mu     sync.Mutex // guards groups and locks
	groups map[groupKey]map[string]chan<- struct{}
	locks  map[lockKey]*queueLock
}

type lockKey struct {
	g groupKey
	q int
}

type queueLock struct {
	owner string
	freed chan struct{} // closed when the lock is released
}

var _ coordinator = (*memCoordinator)(nil)

func newMemCoordinator() *memCoordinator {
	return &memCoordinator{groups: map[groupKey]map[string]chan<- struct{}{}, locks: map[lockKey]*queueLock{}}
}

func (c *memCoordinator) join(g groupKey, member string, notify chan<- struct{}) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ms := c.groups[g]
	if _, ok := ms[member]; ok {
		return fmt.Errorf("%w: member %q already in group %q of topic %q", ErrInvalidOption, member, g.scope, g.topic)
	}
	if ms == nil {
		ms = map[string]chan<- struct{}{}
		c.groups[g] = ms
	}
	ms[member] = notify
	c.notifyLocked(ms)
	return nil
}

func (c *memCoordinator) leave(g groupKey, member string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ms := c.groups[g]
	if _, ok := ms[member]; !ok {
		return
	}
	delete(ms, member)
	if len(ms) == 0 {
		delete(c.groups, g)
	}
	c.notifyLocked(ms)
}

func (c *memCoordinator) notifyLocked(ms map[string]chan<- struct{}) {
	for _, ch := range ms {
		select {
		case ch <- struct{}{}:
		default: // a change is already pending
		}
	}
}

func (c *memCoordinator) members(g groupKey) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.groups[g]))
	for m := range c.groups[g] {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

func (c *memCoordinator) lock(ctx context.Context, g groupKey, q int, owner string) error {
	k := lockKey{g, q}
	for {
		c.mu.Lock()
		l := c.locks[k]
		if l == nil {
			c.locks[k] = &queueLock{owner: owner, freed: make(chan struct{})}
			c.mu.Unlock()
			return nil
		}
		freed := l.freed
		c.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *memCoordinator) unlock(g groupKey, q int, owner string) {
	k := lockKey{g, q}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.locks[k]; l != nil && l.owner == owner {
		delete(c.locks, k)
		close(l.freed)
	}
}

// groupRegistry is the broker's part of consumption: the coordinator, the
// consumers to close with the broker, and the committed offsets of every
// cursor reading each topic with [Block] overflow, from which it releases
// those topics' queues. The offsets come from what this broker's members
// commit and, over a cursor store with [CursorGroups], from every group
// the store holds.
type groupRegistry struct {
	coord   coordinator
	cursors CursorStore

	mu        sync.Mutex // guards the fields below
	closers   map[*groupMember]struct{}
	committed map[string]map[string][]int64 // topic -> cursor scope -> offset per queue
	seeded    map[string]bool               // topics whose groups were read from the store
	closed    bool
}

func (r *groupRegistry) init(cursors CursorStore) {
	r.coord = newMemCoordinator()
	r.cursors = cursors
	r.closers = map[*groupMember]struct{}{}
	r.committed = map[string]map[string][]int64{}
	r.seeded = map[string]bool{}
}

// add registers a member to close with the broker.
func (r *groupRegistry) add(m *groupMember) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.closers[m] = struct{}{}
	return nil
}

func (r *groupRegistry) remove(m *groupMember) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.closers, m)
}

// closeAll closes every member registered and refuses new ones.
func (r *groupRegistry) closeAll() error {
	r.mu.Lock()
	r.closed = true
	ms := make([]*groupMember, 0, len(r.closers))
	for m := range r.closers {
		ms = append(ms, m)
	}
	r.mu.Unlock()
	var errs []error
	for _, m := range ms {
		errs = append(errs, m.close())
	}
	return errors.Join(errs...)
}

// seed adds the groups the cursor store holds for t, a topic with [Block]
// overflow, to its progress, once per topic: a group that committed
// before this broker started holds the topic back as much as one
// consuming now.
func (r *groupRegistry) seed(ctx context.Context, t *topicState) error {
	if t.meta.Retention.Overflow != Block {
		return nil
	}
	cg, ok := r.cursors.(CursorGroups)
	if !ok {
		return nil
	}
	name := t.meta.Name
	r.mu.Lock()
	done := r.seeded[name]
	r.mu.Unlock()
	if done {
		return nil
	}
	cs, err := cg.Cursors(ctx, name, len(t.queues))
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seeded[name] {
		return nil // seeded meanwhile, perhaps before a forget
	}
	r.seeded[name] = true
	for scope, c := range cs.Groups {
		r.registerLocked(name, scope, c.Offsets)
	}
	return nil
}

// register records that scope reads topic, so its progress holds back the
// release of Block queues from the start, before its first commit.
func (r *groupRegistry) register(topic, scope string, start []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registerLocked(topic, scope, start)
}

func (r *groupRegistry) registerLocked(topic, scope string, start []int64) {
	byScope := r.committed[topic]
	if byScope == nil {
		byScope = map[string][]int64{}
		r.committed[topic] = byScope
	}
	if _, ok := byScope[scope]; !ok {
		offs := make([]int64, len(start))
		for i := range offs {
			offs[i] = max(0, start[i])
		}
		byScope[scope] = offs
	}
}

// committedTo records a commit and returns the offset below which every
// group reading the topic is done with queue q.
func (r *groupRegistry) committedTo(topic, scope string, q int, offset int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	byScope := r.committed[topic]
	if offs := byScope[scope]; q < len(offs) {
		offs[q] = offset
	}
	low := offset
	for _, offs := range byScope {
		if q < len(offs) {
			low = min(low, offs[q])
		}
	}
	return low
}

// forget drops the progress of group on t (its own scope and those of its
// broadcast members, "<group>@<member>") and deletes its cursors from a
// store with [CursorGroups], so it no longer holds back the release of
// Block queues, and releases what that frees. If a member of one of those
// scopes is still open in this broker (closing included), or live
// reports one elsewhere, nothing changes and forget returns
// ErrGroupActive. Forgetting a group that never read t does nothing.
func (r *groupRegistry) forget(t *topicState, group string, live func(scope string) bool) error {
	ctx := context.Background()
	if err := r.seed(ctx, t); err != nil {
		return err
	}
	name := t.meta.Name
	mine := func(scope string) bool { return scope == group || strings.HasPrefix(scope, group+"@") }
	r.mu.Lock()
	defer r.mu.Unlock() // held through the store's Forget: no member joins meanwhile
	for m := range r.closers {
		if m.topic == name && mine(m.scope) {
			return fmt.Errorf("%w: %q on topic %q", ErrGroupActive, m.scope, name)
		}
	}
	byScope := r.committed[name]
	scopes := map[string]bool{}
	for scope := range byScope {
		if mine(scope) {
			scopes[scope] = true
		}
	}
	cg, durable := r.cursors.(CursorGroups)
	if durable {
		cs, err := cg.Cursors(ctx, name, len(t.queues))
		if err != nil {
			return err
		}
		for scope := range cs.Groups {
			if mine(scope) {
				scopes[scope] = true
			}
		}
	}
	for scope := range scopes {
		if live(scope) {
			return fmt.Errorf("%w: %q on topic %q", ErrGroupActive, scope, name)
		}
	}
	if durable {
		for scope := range scopes {
			if err := cg.Forget(ctx, name, scope); err != nil {
				return err
			}
		}
	}
	for scope := range scopes {
		delete(byScope, scope)
	}
	if len(scopes) == 0 || t.meta.Retention.Overflow != Block {
		return nil
	}
	// The lowest offset of what remains per queue; with no group left,
	// nothing was consumed (as before the first group came) and nothing
	// more is released.
	for q := range t.queues {
		low := int64(-1)
		for _, offs := range byScope {
			if q < len(offs) && (low < 0 || offs[q] < low) {
				low = offs[q]
			}
		}
		if rel, ok := t.queues[q].(Releaser); ok && low > 0 {
			rel.Release(low)
		}
	}
	return nil
}
