package ferry

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// QueueLag is one queue's view of a group's progress.
type QueueLag struct {
	// Queue is the queue.
	Queue QueueID
	// Committed is the group's committed cursor (the next offset it
	// consumes), -1 when it has committed nothing on the queue.
	Committed int64
	// Oldest and Next are the queue's oldest retained and next offsets.
	Oldest, Next int64
	// Lag is how many retained messages the group has still to consume:
	// Next − max(Committed, Oldest). A group without a cursor counts
	// every retained message (it starts from the oldest by default).
	Lag int64
}

// GroupLag is a consumer group's progress on a topic: per queue, and
// totals.
type GroupLag struct {
	// Group is the cursor group: a consumer group, or
	// "<group>@<member>" for a broadcast member.
	Group string
	// Topic is the topic.
	Topic string
	// Members are the group's live members (see [Coordinator.Members]).
	Members []string
	// Queues is one entry per queue of the topic, by queue.
	Queues []QueueLag
	// Lag is the sum of the queues' Lag.
	Lag int64
}

// Groups returns the progress of every group with a committed cursor on
// topic, sorted by group (broadcast members' cursors are groups of their
// own, "<group>@<member>"). It needs a cursor store with [CursorGroups],
// as the memory and file stores are; over another store it is
// [ErrInvalidOption]. An unknown topic is [ErrTopicNotFound].
func (b *Broker) Groups(ctx context.Context, topic string) ([]GroupLag, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "groups", Err: err}
	}
	t, cg, err := b.adminTopic(topic)
	if err != nil {
		return nil, &Error{Op: "groups", Err: err}
	}
	cs, err := cg.Cursors(ctx, topic, len(t.queues))
	if err != nil {
		return nil, &Error{Op: "groups", Err: err}
	}
	names := slices.Sorted(mapKeysOf(cs.Groups))
	out := make([]GroupLag, 0, len(names))
	for _, g := range names {
		gl, err := b.groupLag(ctx, t, g, cs.Groups[g].Offsets)
		if err != nil {
			return nil, &Error{Op: "groups", Err: err}
		}
		out = append(out, gl)
	}
	return out, nil
}

// Lag returns the progress of group on topic (group first, as in every
// call of the package that takes both). A group with neither a
// committed cursor nor a live member there is [ErrGroupNotFound]; a live
// group that has committed nothing on a queue has every retained message
// of it to go. Other errors as [Broker.Groups].
func (b *Broker) Lag(ctx context.Context, group, topic string) (GroupLag, error) {
	if err := checkContext(ctx); err != nil {
		return GroupLag{}, &Error{Op: "lag", Err: err}
	}
	t, _, err := b.adminTopic(topic)
	if err != nil {
		return GroupLag{}, &Error{Op: "lag", Err: err}
	}
	offs, err := b.cursors.Load(ctx, topic, group, len(t.queues))
	if err != nil {
		return GroupLag{}, &Error{Op: "lag", Err: err}
	}
	gl, err := b.groupLag(ctx, t, group, offs)
	if err != nil {
		return GroupLag{}, &Error{Op: "lag", Err: err}
	}
	if len(gl.Members) == 0 && !slices.ContainsFunc(offs, func(o int64) bool { return o >= 0 }) {
		return GroupLag{}, &Error{Op: "lag", Err: fmt.Errorf("%w: %q on topic %q", ErrGroupNotFound, group, topic)}
	}
	return gl, nil
}

// adminTopic returns the named topic and the cursor store's group
// listing.
func (b *Broker) adminTopic(topic string) (*topicState, CursorGroups, error) {
	t, err := b.topic(topic)
	if err != nil {
		return nil, nil, err
	}
	cg, ok := b.cursors.(CursorGroups)
	if !ok {
		return nil, nil, fmt.Errorf("%w: cursor store %T does not list groups (ferry.CursorGroups)", ErrInvalidOption, b.cursors)
	}
	return t, cg, nil
}

func (b *Broker) groupLag(ctx context.Context, t *topicState, group string, offs []int64) (GroupLag, error) {
	gl := GroupLag{Group: group, Topic: t.meta.Name, Queues: make([]QueueLag, len(t.queues))}
	members, err := b.coord.Members(ctx, GroupKey{Scope: group, Topic: t.meta.Name})
	if err != nil {
		return GroupLag{}, err
	}
	gl.Members = members
	for i, q := range t.queues {
		oldest, next, err := queueOffsets(ctx, q)
		if err != nil {
			return GroupLag{}, err
		}
		ql := QueueLag{Queue: QueueID{Topic: t.meta.Name, Queue: i}, Committed: -1, Oldest: oldest, Next: next}
		if i < len(offs) {
			ql.Committed = offs[i]
		}
		ql.Lag = max(0, next-max(ql.Committed, oldest))
		gl.Queues[i] = ql
		gl.Lag += ql.Lag
	}
	return gl, nil
}

// ResetTo says where [Broker.ResetGroup] moves a group's cursors: make
// one with [ResetToEarliest], [ResetToLatest], [ResetToOffsets] or
// [ResetToTime].
type ResetTo struct {
	kind    int // resetEarliest, resetLatest, resetOffsets, resetTime
	offsets map[int]int64
	at      time.Time
}

const (
	resetEarliest = iota + 1
	resetLatest
	resetOffsets
	resetTime
)

// ResetToEarliest moves every cursor to its queue's oldest retained
// offset: the group consumes again all that is retained.
func ResetToEarliest() ResetTo { return ResetTo{kind: resetEarliest} }

// ResetToLatest moves every cursor to its queue's next offset: the group
// skips all that is retained.
func ResetToLatest() ResetTo { return ResetTo{kind: resetLatest} }

// ResetToOffsets moves the cursors of the queues named (by index) to the
// given offsets, which must lie in their queue's retained range [oldest,
// next]; the others stay.
func ResetToOffsets(offsets map[int]int64) ResetTo {
	return ResetTo{kind: resetOffsets, offsets: offsets}
}

// ResetToTime moves every cursor to the first message of its queue
// stored at or after t (its StoreTime), or to the queue's next offset if
// there is none; a time before the oldest retained message is the oldest.
// StoreTime is taken as growing along a queue (the store's clock, or the
// producers' in memory), and the offset is found by binary search over
// the queue's reads, not by a scan.
func ResetToTime(t time.Time) ResetTo { return ResetTo{kind: resetTime, at: t} }

// ResetGroup moves the cursors of group on topic as to says, and returns
// where each queue's cursor now stands (one offset per queue). It is
// refused with [ErrGroupActive] while the group has a member (in this
// broker, closing included, or live elsewhere by the coordinator), as
// Kafka refuses to reset an active group: stop its consumers first, or
// use Consumer.Seek. An empty group is [ErrInvalidOption], an unknown
// topic [ErrTopicNotFound], an offset outside its queue's retained range
// or a queue out of range [ErrOffsetOutOfRange], and then nothing moves.
func (b *Broker) ResetGroup(ctx context.Context, group, topic string, to ResetTo) ([]int64, error) {
	offs, err := b.resetGroup(ctx, group, topic, to)
	if err != nil {
		return nil, &Error{Op: fmt.Sprintf("reset group %q on %q", group, topic), Err: err}
	}
	return offs, nil
}

func (b *Broker) resetGroup(ctx context.Context, group, topic string, to ResetTo) ([]int64, error) {
	if err := checkContext(ctx); err != nil {
		return nil, err
	}
	if group == "" || len(group) > 255 {
		return nil, fmt.Errorf("%w: group name of %d bytes", ErrInvalidOption, len(group))
	}
	t, err := b.topic(topic)
	if err != nil {
		return nil, err
	}
	if to.kind == 0 {
		return nil, fmt.Errorf("%w: a zero ResetTo", ErrInvalidOption)
	}
	if err := b.groups.checkIdle(ctx, t, group); err != nil {
		return nil, err
	}
	cur, err := b.cursors.Load(ctx, topic, group, len(t.queues))
	if err != nil {
		return nil, err
	}
	target := slices.Clone(cur)
	for q := range to.offsets {
		if q < 0 || q >= len(t.queues) {
			return nil, fmt.Errorf("%w: queue %d of %d", ErrOffsetOutOfRange, q, len(t.queues))
		}
	}
	for i, q := range t.queues {
		oldest, next, err := queueOffsets(ctx, q)
		if err != nil {
			return nil, err
		}
		switch to.kind {
		case resetEarliest:
			target[i] = oldest
		case resetLatest:
			target[i] = next
		case resetOffsets:
			off, ok := to.offsets[i]
			if !ok {
				continue
			}
			if off < oldest || off > next {
				return nil, fmt.Errorf("%w: queue %d offset %d outside [%d, %d]", ErrOffsetOutOfRange, i, off, oldest, next)
			}
			target[i] = off
		case resetTime:
			off, err := offsetAtTime(ctx, q, to.at, oldest, next)
			if err != nil {
				return nil, err
			}
			target[i] = off
		}
	}
	for i, off := range target {
		if off < 0 || off == cur[i] {
			continue
		}
		if err := b.cursors.Commit(ctx, topic, group, i, off); err != nil {
			return nil, err
		}
	}
	b.groups.invalidate(topic) // a Block release must see the cursors moved back
	b.log.Info("ferry: group reset", "group", group, "topic", topic, "from", cur, "to", target)
	return target, nil
}

// offsetAtTime returns the first offset in [oldest, next) of q whose
// message was stored at or after at, or next, by binary search.
func offsetAtTime(ctx context.Context, q Queue, at time.Time, oldest, next int64) (int64, error) {
	one := make([]*EnhancedMessage, 1)
	lo, hi := oldest, next // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		n, err := q.Read(ctx, mid, one)
		if err != nil {
			return 0, err
		}
		if n < 1 {
			return 0, fmt.Errorf("queue %T read nothing at %d", q, mid)
		}
		if !one[0].StoreTime().Before(at) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// seek moves the member's held queues as to says (see [Consumer.Seek]).
func (m *groupMember) seek(ctx context.Context, to ResetTo) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if to.kind == 0 {
		return fmt.Errorf("%w: a zero ResetTo", ErrInvalidOption)
	}
	m.mu.Lock()
	runs := map[int]*queueRun{}
	for q, r := range m.runs {
		if r.h.serving() {
			runs[q] = r
		}
	}
	m.mu.Unlock()
	for q := range to.offsets {
		if runs[q] == nil {
			return fmt.Errorf("%w: queue %d of %q is not held by this consumer", ErrInvalidOption, q, m.topic)
		}
	}
	targets := map[*queueRun]int64{}
	for q, r := range runs {
		oldest, next, err := queueOffsets(ctx, r.queue)
		if err != nil {
			return err
		}
		switch to.kind {
		case resetEarliest:
			targets[r] = oldest
		case resetLatest:
			targets[r] = next
		case resetOffsets:
			off, ok := to.offsets[q]
			if !ok {
				continue
			}
			if off < oldest || off > next {
				return fmt.Errorf("%w: queue %d offset %d outside [%d, %d]", ErrOffsetOutOfRange, q, off, oldest, next)
			}
			targets[r] = off
		case resetTime:
			off, err := offsetAtTime(ctx, r.queue, to.at, oldest, next)
			if err != nil {
				return err
			}
			targets[r] = off
		}
	}
	var errs []error
	waits := map[*queueRun]chan error{}
	for r, off := range targets {
		done := make(chan error, 1)
		if !r.requestSeek(ctx, seekReq{to: off, done: done}) {
			errs = append(errs, fmt.Errorf("%s: %w", r.id, ErrClosed))
			continue
		}
		waits[r] = done
	}
	for r, done := range waits {
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, &Error{Op: r.id.String(), Err: err})
			}
		case <-r.done:
			errs = append(errs, fmt.Errorf("%s: released: %w", r.id, ErrClosed))
		case <-ctx.Done():
			return ctx.Err() // the seeks go on
		}
	}
	return joinErrors(errs...)
}

// DeleteTopicOption configures [Broker.DeleteTopic].
type DeleteTopicOption func(*deleteTopicConfig)

type deleteTopicConfig struct {
	force bool
}

// ForceDelete makes [Broker.DeleteTopic] delete the topic even while
// groups are live; the consumers of it in this broker are closed first.
// Default: a topic with a live group is [ErrGroupActive].
func ForceDelete() DeleteTopicOption {
	return func(c *deleteTopicConfig) { c.force = true }
}

// DeleteTopic deletes a topic: its queues, their messages, the storage's
// metadata and the groups' cursors on it (over a cursor store with
// [CursorGroups]). A topic with a live group (a consumer of it open in
// this broker, or a member live elsewhere by the coordinator) is
// [ErrGroupActive] unless [ForceDelete] is given. The storage must implement
// [TopicDeleter] (the memory and file storages do): otherwise
// [ErrInvalidOption]. An unknown topic is [ErrTopicNotFound]. A later
// Send to the topic is [ErrTopicNotFound], in every broker sharing the
// storage: one that has the topic open finds it gone when its queues say
// [ErrClosed], and finds a topic created again under the name (another
// incarnation, see [TopicMeta.Incarnation]) the same way: a Send goes to
// the new topic, a SendBatch or SendAsync that failed is not sent again
// (a part of it may be stored) but the next goes to the new topic.
// Delayed messages and retries bound for the deleted topic are dropped
// when due, never delivered to a topic created again. Consumers in other
// brokers on the deleted topic get ErrClosed from its queues (see
// [WithOnError]) until they are closed.
func (b *Broker) DeleteTopic(ctx context.Context, name string, opts ...DeleteTopicOption) error {
	var cfg deleteTopicConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if IsSystemTopic(name) {
		return &Error{Op: fmt.Sprintf("delete topic %q", name), Err: reserved(name)}
	}
	if err := b.deleteTopic(ctx, name, cfg.force); err != nil {
		return &Error{Op: fmt.Sprintf("delete topic %q", name), Err: err}
	}
	return nil
}

func (b *Broker) deleteTopic(ctx context.Context, name string, force bool) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	t, err := b.topic(name)
	if err != nil {
		return err
	}
	td, ok := b.storage.(TopicDeleter)
	if !ok {
		return fmt.Errorf("%w: storage %T cannot delete topics (ferry.TopicDeleter)", ErrInvalidOption, b.storage)
	}
	var groups []string
	if cg, ok := b.cursors.(CursorGroups); ok {
		cs, err := cg.Cursors(ctx, name, len(t.queues))
		if err != nil {
			return err
		}
		groups = slices.Sorted(mapKeysOf(cs.Groups))
	}
	local := b.groups.membersOf(name)
	if !force {
		if len(local) > 0 {
			return fmt.Errorf("%w: %q has consumers open in this broker", ErrGroupActive, name)
		}
		for _, g := range groups {
			if err := b.groups.checkIdle(ctx, t, g); err != nil {
				return err
			}
		}
	}
	var errs []error
	for _, m := range local {
		errs = append(errs, m.closeAll())
	}
	b.mu.Lock()
	if cur, _ := b.lookup(name); cur == t {
		b.unpublish(name)
	}
	t.stale.Store(true)
	b.mu.Unlock()
	if err := td.DeleteTopic(ctx, name); err != nil {
		return joinErrors(append(errs, err)...)
	}
	if cg, ok := b.cursors.(CursorGroups); ok {
		for _, g := range groups {
			if err := cg.Forget(ctx, name, g); err != nil {
				errs = append(errs, err)
			}
		}
	}
	b.groups.invalidate(name)
	b.log.Info("ferry: topic deleted", "topic", name, "groups", groups)
	return joinErrors(errs...)
}

// AddQueues grows topic to queues queues: the existing queues and their
// offsets stay as they are, the new ones start empty, and the consumers
// of the topic in this broker rebalance over all of them. Keys then hash
// over the new count ([KeyHashRouter]), so a key's later messages may go
// to another queue than its earlier ones: per-key order holds within each
// queue, not across the change. Fewer queues than now is
// [ErrInvalidTopic] and changes nothing; the same count does nothing. An
// unknown topic is [ErrTopicNotFound]. Brokers sharing the storage see
// the new count when they open the topic again.
func (b *Broker) AddQueues(ctx context.Context, topic string, queues int) error {
	if IsSystemTopic(topic) {
		return &Error{Op: fmt.Sprintf("add queues to %q", topic), Err: reserved(topic)}
	}
	if err := b.addQueues(ctx, topic, queues); err != nil {
		return &Error{Op: fmt.Sprintf("add queues to %q", topic), Err: err}
	}
	return nil
}

func (b *Broker) addQueues(ctx context.Context, name string, queues int) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if _, err := b.topic(name); err != nil { // opens it if another broker made it
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return ErrClosed
	}
	t, _ := b.lookup(name)
	if t == nil {
		return fmt.Errorf("%w: %q", ErrTopicNotFound, name)
	}
	switch {
	case queues < t.meta.Queues:
		return fmt.Errorf("%w: %d queues, fewer than the %d it has", ErrInvalidTopic, queues, t.meta.Queues)
	case queues == t.meta.Queues:
		return nil
	}
	meta := t.meta
	meta.Queues = queues
	if err := meta.Validate(); err != nil {
		return err
	}
	grown := &topicState{meta: meta, queues: slices.Clone(t.queues)}
	for i := t.meta.Queues; i < queues; i++ {
		q, err := b.storage.OpenQueue(ctx, meta, i)
		if err != nil {
			for _, q := range grown.queues[t.meta.Queues:] {
				_ = q.Close()
			}
			return err
		}
		grown.queues = append(grown.queues, q)
	}
	if err := b.storage.SaveTopic(ctx, meta); err != nil {
		for _, q := range grown.queues[t.meta.Queues:] {
			_ = q.Close()
		}
		return err
	}
	b.publish(grown)
	t.stale.Store(true)
	for _, m := range b.groups.membersOf(name) {
		m.topicGrew()
	}
	b.log.Info("ferry: queues added", "topic", name, "from", t.meta.Queues, "to", queues)
	return nil
}
