package ferry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// Broker is the in-process owner of topics, queues, cursors and group
// membership. Producers and consumers are made from it.
//
// A Broker is safe for concurrent use. Its own goroutines move delayed
// messages (see [Message.DeliverAt]): they start when the first one is
// sent, or at NewBroker when the storage holds some. Close stops them,
// closes the consumers made from it, the queues it opened and the stores
// it created itself.
type Broker struct {
	storage     Storage
	cursors     CursorStore
	coord       Coordinator
	log         *slog.Logger
	ownsStorage bool
	ownsCursors bool
	ownsCoord   bool
	hooks       *hookSet // nil: none

	// topics maps names to their state: Send reads it without a lock,
	// and a create adds one entry (no copy of the whole map).
	topics *topicTable
	closed atomic.Bool

	mu sync.Mutex // serializes CreateTopic and Close

	groups groupRegistry // membership, queue locks, consumers to close
	clock  *coarseClock  // stamps messages
	time   Clock         // delays and retries run on it (see WithClock)
	delay  *delayer      // moves delayed messages
	// runners run consumers' fetch loops when a write wakes them.
	runners *runnerPool
	// urgent counts the rebalances and queue takes in progress in the
	// broker's consumers. While it is not zero, their workers yield the
	// processor between batches: with CPU-bound handlers on every core,
	// the goroutines that release and take queues would otherwise wait
	// behind them for whole scheduler time slices (measured: a member
	// joining a group of 256 queues whose 20 workers spun took
	// 0.45–1.1 s; with the yield, 59–69 ms). Per broker: another
	// broker's rebalance does not slow this one's workers.
	urgent atomic.Int32
}

// topicState is a topic and its open queues; immutable once published.
type topicState struct {
	meta   TopicMeta
	queues []Queue
	stale  atomic.Bool // deleted, or replaced by AddQueues: producers look the topic up again
}

// BrokerOption configures a Broker.
type BrokerOption func(*brokerConfig)

type brokerConfig struct {
	storage Storage
	cursors CursorStore
	coord   Coordinator
	log     *slog.Logger
	hooks   []Hook
	clock   Clock
}

// WithStorage sets where queues and topic metadata live. Default: a new
// [MemoryStorage], closed with the broker. A storage passed here stays the
// caller's to close, after the broker.
func WithStorage(s Storage) BrokerOption { return func(c *brokerConfig) { c.storage = s } }

// WithCursorStore sets where consumer cursors persist. Default: a new
// [MemoryCursorStore], closed with the broker. A store passed here stays
// the caller's to close, after the broker.
func WithCursorStore(s CursorStore) BrokerOption { return func(c *brokerConfig) { c.cursors = s } }

// WithCoordinator sets what keeps consumer group membership and queue
// locks. Default: a new [MemoryCoordinator], closed with the broker, which
// sees this broker's members only. Brokers that share a coordinator, a
// [Storage] and a [CursorStore] (a [MemoryCoordinator] within a process, a
// distributed one across processes) behave as one: a group's members in
// any of them split the queues, one owner each. A coordinator passed here
// stays the caller's to close, after the broker.
func WithCoordinator(c Coordinator) BrokerOption { return func(cfg *brokerConfig) { cfg.coord = c } }

// WithLogger sets the logger for events worth knowing (rebalances, cursor
// resets, dead letters). Default: discard.
func WithLogger(l *slog.Logger) BrokerOption { return func(c *brokerConfig) { c.log = l } }

// NewBroker returns a broker. It reloads and opens the topics the storage
// already holds, so a persistent storage brings its topics back.
func NewBroker(opts ...BrokerOption) (*Broker, error) {
	var c brokerConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	b := &Broker{storage: c.storage, cursors: c.cursors, coord: c.coord, log: c.log, clock: newCoarseClock(), hooks: newHookSet(nil, c.hooks), runners: newRunnerPool(), topics: newTopicTable()}
	if b.storage == nil {
		b.storage, b.ownsStorage = NewMemoryStorage(), true
	}
	if b.cursors == nil {
		b.cursors, b.ownsCursors = NewMemoryCursorStore(), true
	}
	if b.coord == nil {
		b.coord, b.ownsCoord = NewMemoryCoordinator(), true
	}
	b.groups.init(b.coord, b.cursors)
	b.time = c.clock
	if b.time == nil {
		b.time = systemClock{}
	}
	b.delay = newDelayer(b, b.time)
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	metas, err := b.storage.Topics(context.Background())
	if err != nil {
		return nil, joinErrors(&Error{Op: "new broker: load topics", Err: err}, b.closeStores())
	}
	for _, meta := range metas {
		t, err := b.openTopic(context.Background(), meta.Normalized())
		if err != nil {
			return nil, joinErrors(&Error{Op: "new broker", Err: err}, b.Close())
		}
		b.publish(t)
	}
	// Delayed messages written before: their movers start now.
	for _, meta := range metas {
		if n, ok := delayLevelOf(meta.Name); ok {
			if _, err := b.delay.run(n); err != nil {
				return nil, joinErrors(&Error{Op: "new broker", Err: err}, b.Close())
			}
		}
	}
	if !b.ownsStorage {
		// Other brokers may share the storage: the levels they make are
		// this broker's to move too (see discoverLoop).
		b.delay.discovering()
	}
	return b, nil
}

// CreateTopic creates a topic and opens its queues. It is idempotent for
// equal metadata (after defaults are applied, see [TopicMeta.Normalized]);
// different metadata for an existing name is [ErrTopicExists]; invalid
// metadata, or a system topic's name (see [IsSystemTopic]), is
// [ErrInvalidTopic].
func (b *Broker) CreateTopic(ctx context.Context, meta TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "create topic", Err: err}
	}
	if IsSystemTopic(meta.Name) {
		return &Error{Op: "create topic", Err: reserved(meta.Name)}
	}
	return b.createTopic(ctx, meta)
}

// createTopic is CreateTopic, for a system topic too. The storage decides
// (another broker sharing it may have deleted the topic, or created it
// again, since this one opened it): the topic this broker has open is
// replaced when the storage holds another incarnation.
func (b *Broker) createTopic(ctx context.Context, meta TopicMeta) error {
	if err := meta.Validate(); err != nil {
		return &Error{Op: "create topic", Err: err}
	}
	meta = meta.Normalized()
	meta.Incarnation = newIncarnation()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return &Error{Op: fmt.Sprintf("create topic %q", meta.Name), Err: ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: fmt.Sprintf("create topic %q", meta.Name), Err: err}
	}
	stored, err := b.saveTopic(ctx, meta)
	if errors.Is(err, ErrTopicExists) {
		// Another topic of that name; this broker's may be an earlier
		// one. The error shows the one there, as the storage has it.
		if have, serr := b.storedTopic(ctx, meta.Name); serr == nil {
			have = have.Normalized()
			if cur, ok := b.lookup(meta.Name); ok {
				_, _ = b.adoptLocked(ctx, cur, have)
			}
			have.Incarnation, meta.Incarnation = 0, 0
			err = fmt.Errorf("%w: have %+v, asked %+v", ErrTopicExists, have, meta)
		}
	}
	if err != nil {
		return &Error{Op: fmt.Sprintf("create topic %q", meta.Name), Err: err}
	}
	cur, _ := b.lookup(meta.Name)
	if _, err := b.adoptLocked(ctx, cur, stored); err != nil {
		return &Error{Op: "create topic", Err: err}
	}
	if stored.Incarnation == meta.Incarnation {
		b.log.Info("ferry: topic created", "topic", meta.Name, "queues", meta.Queues)
	}
	return nil
}

// saveTopic records meta in the storage unless a topic of that name is
// there: matching metadata is fine, other is ErrTopicExists. It returns
// the metadata stored, normalized: meta, or the topic that was there,
// with its incarnation. A [SharedStorage] decides atomically; over
// another storage, brokers that share it may race.
func (b *Broker) saveTopic(ctx context.Context, meta TopicMeta) (TopicMeta, error) {
	if ss, ok := b.storage.(SharedStorage); ok {
		if err := ss.CreateTopic(ctx, meta); err != nil {
			return TopicMeta{}, err
		}
		have, err := ss.Topic(ctx, meta.Name)
		if err != nil {
			return TopicMeta{}, err
		}
		return have.Normalized(), nil
	}
	have, err := b.storedTopic(ctx, meta.Name)
	switch {
	case err == nil && have.Matches(meta):
		return have.Normalized(), nil
	case err == nil:
		return TopicMeta{}, fmt.Errorf("%w: have %+v, asked %+v", ErrTopicExists, have.Normalized(), meta)
	case !errors.Is(err, ErrTopicNotFound):
		return TopicMeta{}, err
	}
	return meta, b.storage.SaveTopic(ctx, meta)
}

// storedTopic returns the metadata the storage holds for name, or
// ErrTopicNotFound.
func (b *Broker) storedTopic(ctx context.Context, name string) (TopicMeta, error) {
	if ss, ok := b.storage.(SharedStorage); ok {
		return ss.Topic(ctx, name)
	}
	metas, err := b.storage.Topics(ctx)
	if err != nil {
		return TopicMeta{}, err
	}
	for _, m := range metas {
		if m.Name == name {
			return m, nil
		}
	}
	return TopicMeta{}, fmt.Errorf("%w: %q", ErrTopicNotFound, name)
}

// discover opens a topic that another broker created over the same
// storage, or returns ErrTopicNotFound.
func (b *Broker) discover(name string) (*topicState, error) {
	ctx := context.Background()
	meta, err := b.storedTopic(ctx, name)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if t, ok := b.lookup(name); ok {
		return t, nil
	}
	t, err := b.openTopic(ctx, meta.Normalized())
	if err != nil {
		return nil, err
	}
	b.publish(t)
	return t, nil
}

// openTopic opens every queue of meta; on error it closes those it opened.
func (b *Broker) openTopic(ctx context.Context, meta TopicMeta) (*topicState, error) {
	t := &topicState{meta: meta, queues: make([]Queue, meta.Queues)}
	for i := range t.queues {
		q, err := b.storage.OpenQueue(ctx, meta, i)
		if err != nil {
			for _, q := range t.queues[:i] {
				_ = q.Close()
			}
			return nil, &Error{Op: fmt.Sprintf("open topic %q queue %d", meta.Name, i), Err: err}
		}
		t.queues[i] = q
	}
	return t, nil
}

// publish adds t to the topic map, or replaces the topic of its name. b.mu
// must be held (or b not yet shared).
func (b *Broker) publish(t *topicState) { b.topics.store(t) }

// unpublish removes the named topic from the topic map. b.mu held.
func (b *Broker) unpublish(name string) { b.topics.remove(name) }

// lookup returns the named topic if the broker has it open.
func (b *Broker) lookup(name string) (*topicState, bool) {
	return b.topics.lookup(name)
}

// each calls f for every topic open.
func (b *Broker) each(f func(t *topicState)) {
	b.topics.each(f)
}

// Topic returns the metadata of the named topic, as this broker has it
// open: a topic that another broker sharing the storage deleted, or
// deleted and created again, is seen so on this broker's next send to it
// or CreateTopic of it (see [TopicMeta.Incarnation]).
func (b *Broker) Topic(name string) (TopicMeta, bool) {
	t, err := b.topic(name)
	if err != nil {
		return TopicMeta{}, false
	}
	return t.meta, true
}

// Topics returns the metadata of every topic, sorted by name.
func (b *Broker) Topics() []TopicMeta {
	var out []TopicMeta
	b.each(func(t *topicState) { out = append(out, t.meta) })
	slices.SortFunc(out, func(a, b TopicMeta) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// topic returns the named topic, or an error wrapping ErrClosed,
// ErrInvalidTopic or ErrTopicNotFound.
func (b *Broker) topic(name string) (*topicState, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if t, ok := b.lookup(name); ok {
		return t, nil
	}
	if err := ValidateTopicName(name); err != nil {
		return nil, err
	}
	return b.discover(name)
}

// Queue returns queue i of the named topic, for reading it directly.
// Errors wrap ErrClosed, ErrTopicNotFound or ErrInvalidTopic (for a bad
// name, or i out of range, as in [Storage.OpenQueue]).
func (b *Broker) Queue(topic string, i int) (ReadableQueue, error) {
	t, err := b.topic(topic)
	if err != nil {
		return nil, &Error{Op: "queue", Err: err}
	}
	if i < 0 || i >= len(t.queues) {
		return nil, &Error{Op: "queue", Err: fmt.Errorf("%w: queue %d of %d in topic %q", ErrInvalidTopic, i, len(t.queues), topic)}
	}
	return t.queues[i], nil
}

// ForgetGroup tells the broker that consumer group will not come back to
// topic: its progress (and that of its broadcast members) no longer holds
// back the queues of a topic with [Block] overflow, so producers waiting on
// it resume as far as the remaining groups allow. Over a cursor store with
// [CursorGroups] (the memory and file stores) its cursors on topic are
// deleted too, so the group stays forgotten after a restart, and a group
// of that name that does come back starts as a new one (see
// [WithStartFrom]); over another store the cursors stay, and only this
// broker forgets. A group with a consumer on topic that is open in this
// broker (closing included) or a live member elsewhere is
// [ErrGroupActive], and nothing changes; a group that never read topic is
// left as it is. A consumer made with [Broadcast] and no [WithMemberID]
// forgets its own progress on Close, as its generated ID can never come
// back. The group's retry topic for topic (see [RetryTopic]), with the
// retries waiting in it, is deleted too, where the storage can. ctx bounds
// the calls to the coordinator, the cursor store and the storage.
func (b *Broker) ForgetGroup(ctx context.Context, group, topic string) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "forget group", Err: err}
	}
	t, err := b.topic(topic)
	if err != nil {
		return &Error{Op: "forget group", Err: err}
	}
	if group == "" {
		return &Error{Op: "forget group", Err: fmt.Errorf("%w: empty group", ErrInvalidOption)}
	}
	if err := b.groups.forget(ctx, t, group); err != nil {
		return &Error{Op: "forget group", Err: err}
	}
	if _, ok := b.storage.(TopicDeleter); ok {
		if name, err := RetryTopic(group, topic); err == nil {
			if _, err := b.topic(name); err == nil {
				if err := b.deleteTopic(ctx, name, false); err != nil {
					return &Error{Op: fmt.Sprintf("forget group: retry topic %q", name), Err: err}
				}
			}
		}
	}
	return nil
}

// Close closes the consumers made from the broker (each drains and commits),
// then, over a storage the broker created, every queue it opened and the
// stores it created. The queues of a storage passed with [WithStorage]
// stay open, since other brokers may share them: they close with the
// storage (a Send blocked on a full [Block] queue waits for that, or for
// its ctx). It is idempotent; afterwards every method returns
// [ErrClosed].
func (b *Broker) Close() error {
	b.delay.close()
	consumersErr := b.groups.closeAll()
	b.runners.close()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Swap(true) {
		return nil
	}
	b.clock.close()
	errs := []error{consumersErr}
	if b.ownsStorage {
		b.each(func(t *topicState) {
			for _, q := range t.queues {
				if err := q.Close(); err != nil {
					errs = append(errs, err)
				}
			}
		})
	}
	errs = append(errs, b.closeStores())
	return joinErrors(errs...)
}

func (b *Broker) closeStores() error {
	var errs []error
	if b.ownsCoord {
		errs = append(errs, b.coord.Close())
	}
	if b.ownsStorage {
		errs = append(errs, b.storage.Close())
	}
	if b.ownsCursors {
		errs = append(errs, b.cursors.Close())
	}
	return joinErrors(errs...)
}
