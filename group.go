package ferry

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// groupRegistry is the broker's part of consumption: the coordinator, the
// consumers to close with the broker, and the progress of the groups
// reading each topic with [Block] overflow, from which it releases those
// topics' queues. Over a cursor store with [CursorGroups] the progress is
// the store's, read again at a release when the copy here is older than
// progressRefresh, so the groups of every broker over the store (in any
// process) count, running or not; between two reads this broker's own
// commits update the copy, and another's can only be further on than the
// copy says, which holds back more, never less. Over another store it is
// what this broker's members committed since it started.
type groupRegistry struct {
	coord   Coordinator
	cursors CursorStore
	// commitCost is a moving average of the cursor store's commit time
	// (ns), over every member of the broker; it starts slow, so the
	// first commits go to the committers.
	commitCost atomic.Int64

	mu        sync.Mutex // guards the fields below
	closers   map[*groupMember]struct{}
	committed map[string]map[string][]int64 // topic -> cursor scope -> offset per queue
	readAt    map[string]time.Time          // topic -> when committed was read from the store
	closed    bool
}

// progressRefresh bounds the age of the group progress a release of a
// Block queue computes from, over a store with [CursorGroups]: a group
// that starts consuming through another broker holds the queue back
// within this time.
const progressRefresh = 10 * time.Millisecond

func (r *groupRegistry) init(coord Coordinator, cursors CursorStore) {
	r.coord = coord
	r.cursors = cursors
	r.commitCost.Store(int64(time.Second)) // unmeasured: slow
	r.closers = map[*groupMember]struct{}{}
	r.committed = map[string]map[string][]int64{}
	r.readAt = map[string]time.Time{}
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
	return joinErrors(errs...)
}

// register records that scope reads topic from start on (a cursor per
// queue, -1 where none), so that it holds back the release of Block
// queues before its first commit; the store's listing does that by
// itself.
func (r *groupRegistry) register(topic, scope string, start []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
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

// releaseTo returns the offset below which every group reading t is done
// with queue q, given that scope has just committed offset there.
func (r *groupRegistry) releaseTo(ctx context.Context, t *topicState, scope string, q int, offset int64) (int64, error) {
	name := t.meta.Name
	if cg, ok := r.cursors.(CursorGroups); ok {
		r.mu.Lock()
		stale := time.Since(r.readAt[name]) > progressRefresh
		r.mu.Unlock()
		if stale {
			cs, err := cg.Cursors(ctx, name, len(t.queues))
			if err != nil {
				return 0, err
			}
			byScope := make(map[string][]int64, len(cs.Groups))
			for g, c := range cs.Groups {
				for i, o := range c.Offsets {
					c.Offsets[i] = max(0, o)
				}
				byScope[g] = c.Offsets
			}
			r.mu.Lock()
			r.committed[name] = byScope
			r.readAt[name] = time.Now()
			r.mu.Unlock()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	byScope := r.committed[name]
	if offs := byScope[scope]; q < len(offs) {
		offs[q] = offset
	}
	low := offset
	for _, offs := range byScope {
		if q < len(offs) {
			low = min(low, offs[q])
		}
	}
	return low, nil
}

// membersOf returns the members open in this broker on topic.
func (r *groupRegistry) membersOf(topic string) []*groupMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*groupMember
	for m := range r.closers {
		if m.topic == topic {
			out = append(out, m)
		}
	}
	return out
}

// invalidate makes the next release of topic read the store's progress
// again.
func (r *groupRegistry) invalidate(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.readAt, topic)
}

// checkIdle returns ErrGroupActive if scope has a member on t: open in
// this broker (closing included) or live in the coordinator.
func (r *groupRegistry) checkIdle(ctx context.Context, t *topicState, scope string) error {
	name := t.meta.Name
	r.mu.Lock()
	for m := range r.closers {
		if m.topic == name && m.scope == scope {
			r.mu.Unlock()
			return fmt.Errorf("%w: %q on topic %q", ErrGroupActive, scope, name)
		}
	}
	r.mu.Unlock()
	live, err := r.coord.Members(ctx, GroupKey{Scope: scope, Topic: name})
	if err != nil {
		return err
	}
	if len(live) > 0 {
		return fmt.Errorf("%w: %q on topic %q (members %v)", ErrGroupActive, scope, name, live)
	}
	return nil
}

// forget drops the progress of group on t (its own scope and those of its
// broadcast members, "<group>@<member>"): it deletes its cursors from a
// store with [CursorGroups] and what this broker tracks, so it no longer
// holds back the release of Block queues, and releases what that frees.
// If a member of one of those scopes is open in this broker (closing
// included), or the coordinator has one live, nothing changes and forget
// returns ErrGroupActive. Forgetting a group that never read t does
// nothing.
func (r *groupRegistry) forget(ctx context.Context, t *topicState, group string) error {
	name := t.meta.Name
	mine := func(scope string) bool { return scope == group || strings.HasPrefix(scope, group+"@") }
	r.mu.Lock()
	defer r.mu.Unlock() // held through the store's Forget: no member of this broker joins meanwhile
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
		live, err := r.coord.Members(ctx, GroupKey{Scope: scope, Topic: name})
		if err != nil {
			return err
		}
		if len(live) > 0 {
			return fmt.Errorf("%w: %q on topic %q", ErrGroupActive, scope, name)
		}
	}
	for scope := range scopes {
		if durable {
			if err := cg.Forget(ctx, name, scope); err != nil {
				return err
			}
		}
		delete(byScope, scope)
	}
	delete(r.readAt, name) // the next release reads the store again
	if len(scopes) == 0 || t.meta.Retention.Overflow != Block {
		return nil
	}
	// The lowest offset of what remains per queue; with no group left,
	// nothing was consumed (as before the first group came) and nothing
	// more is released.
	var remaining []Cursor
	if durable {
		cs, err := cg.Cursors(ctx, name, len(t.queues))
		if err != nil {
			return err
		}
		for _, c := range cs.Groups {
			remaining = append(remaining, c)
		}
	} else {
		for scope, offs := range byScope {
			remaining = append(remaining, Cursor{Group: scope, Offsets: offs})
		}
	}
	for q := range t.queues {
		low := int64(-1)
		for _, c := range remaining {
			if q < len(c.Offsets) {
				if o := max(0, c.Offsets[q]); low < 0 || o < low {
					low = o
				}
			}
		}
		if rel, ok := t.queues[q].(Releaser); ok && low > 0 {
			rel.Release(low)
		}
	}
	return nil
}
