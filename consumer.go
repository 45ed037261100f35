package ferry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Handler handles one message. A nil error finishes it; an error retries
// it with backoff (see [WithRetry] and [RetryAfter]; in concurrent mode
// through the group's retry topic, so the queue flows on) and, after the
// last attempt or at once for a [Permanent] error, sends it to the
// group's dead-letter topic. A panic counts as an error. A retried
// message comes back as it was sent (its Topic, Queue and Offset are the
// origin's; headers [HeaderAttempts] and the origin's are added).
//
// The message is shared with every other group reading the topic and must
// not be modified. ctx carries the [Delivery] (see [DeliveryFrom]); it is
// reused for the next message, so it is valid only during the call and
// must not be kept. It is cancelled when Close or a rebalance gives up
// waiting for the handler (see [WithDrainTimeout]).
type Handler interface {
	Handle(ctx context.Context, m *EnhancedMessage) error
}

// HandlerFunc adapts a function to a [Handler].
type HandlerFunc func(ctx context.Context, m *EnhancedMessage) error

var _ Handler = HandlerFunc(nil)

// Handle calls f(ctx, m).
func (f HandlerFunc) Handle(ctx context.Context, m *EnhancedMessage) error { return f(ctx, m) }

// Consumer is a push consumer: a member of a consumer group that fetches
// the queues the group assigns it and calls its [Handler] for each
// message, at least once. See [Broker.NewConsumer].
//
// A consumer runs goroutines only while it has work. Its membership loop
// runs when the group changes; on the memory storage a queue's fetch
// loop parks at the end of the queue with no goroutine, and the next
// write wakes it on one of the broker's runners, which then runs the
// handler for what it fetched, as one of the [WithConcurrency] workers;
// more workers start when there are more messages than one handles in
// about 50 µs, and retire after a second without work (on other storages
// each owned queue keeps a fetch goroutine blocked in Read). A committer
// starts when commits cannot be made in place, a retry timer with the
// first retry in place, and a second member, reading the group's retry
// topic, with the first retry off the queue. So 10,000 idle consumers on
// the memory storage keep no goroutine. Close stops what runs and
// returns when it has all returned. A Consumer is safe for concurrent
// use.
type Consumer struct {
	m *groupMember
	h Handler
	d atomic.Pointer[deliverer] // set by Start

	retryMu sync.Mutex // guards retry and closing
	retry   *Consumer  // reads the retry topic, once there are retries
	closing bool
}

// deliverer returns the consumer's deliverer, nil before Start.
func (c *Consumer) deliverer() *deliverer { return c.d.Load() }

// NewConsumer returns a push consumer for topic in group, handling
// messages with h. It does nothing until [Consumer.Start]. An empty or
// too long group, a group or member ID containing '@' (reserved for
// broadcast cursors), an invalid topic name, a nil handler or an option
// value out of range is [ErrInvalidOption] (or [ErrInvalidTopic]), and so
// is a group too long for its default dead-letter topic (see
// [DeadLetterTopic]) without [WithDeadLetter], or, when it retries off
// the queue, for its retry topic (see [RetryTopic]); after the broker's
// Close it is [ErrClosed].
func (b *Broker) NewConsumer(group, topic string, h Handler, opts ...ConsumerOption) (*Consumer, error) {
	cfg, err := newConsumerConfig(group, topic, func(c *consumerConfig) {
		for _, o := range opts {
			if o != nil {
				o.applyConsumer(c)
			}
		}
	})
	if err != nil {
		return nil, &Error{Op: "new consumer", Err: err}
	}
	if h == nil {
		return nil, &Error{Op: "new consumer", Err: fmt.Errorf("%w: nil handler", ErrInvalidOption)}
	}
	if bh, ok := h.(*batchHandler); ok {
		if bh.max < 1 || bh.linger < 0 {
			return nil, &Error{Op: "new consumer", Err: fmt.Errorf("%w: batches of at most %d messages, linger %v", ErrInvalidOption, bh.max, bh.linger)}
		}
		if _, tx := b.cursors.(TxCursorStore); tx {
			return nil, &Error{Op: "new consumer", Err: fmt.Errorf("%w: a batch handler over a cursor store that runs handlers in its transactions (%T)", ErrInvalidOption, b.cursors)}
		}
	}
	if cfg.transactional {
		if _, ok := h.(*batchHandler); ok {
			return nil, &Error{Op: "new consumer", Err: fmt.Errorf("%w: a batch handler with Transactional", ErrInvalidOption)}
		}
		if _, tx := b.cursors.(TxCursorStore); tx {
			return nil, &Error{Op: "new consumer", Err: fmt.Errorf("%w: Transactional over a cursor store that runs handlers in its transactions (%T)", ErrInvalidOption, b.cursors)}
		}
		if cfg.txnLog, err = TransactionLog(group, topic); err != nil {
			return nil, &Error{Op: "new consumer", Err: err}
		}
	}
	if cfg.deadLetter == "" {
		if cfg.deadLetter, err = DeadLetterTopic(group); err != nil {
			return nil, &Error{Op: "new consumer: dead-letter topic (set WithDeadLetter)", Err: err}
		}
	}
	if err := ValidateTopicName(cfg.deadLetter); err != nil {
		return nil, &Error{Op: "new consumer: dead-letter topic (set WithDeadLetter)", Err: fmt.Errorf("%w: %w", ErrInvalidOption, err)}
	}
	if b.closed.Load() {
		return nil, &Error{Op: "new consumer", Err: ErrClosed}
	}
	if cfg.maxAttempts > 1 && !cfg.ordered && !cfg.orderedByKey && !cfg.broadcast {
		// Retries go off the queue (see offQueue), to the retry topic.
		if cfg.retryTopic, err = RetryTopic(group, topic); err != nil {
			return nil, &Error{Op: "new consumer", Err: err}
		}
		if cfg.transactional {
			if _, err := TransactionLog(group, cfg.retryTopic); err != nil {
				return nil, &Error{Op: "new consumer: the retry topic's transaction log", Err: err}
			}
		}
	}
	c := &Consumer{m: newGroupMember(b, group, topic, cfg), h: h}
	c.m.onChanged = func() { _ = c.ensureRetry(c.m.life, false) }
	c.m.closeOwner = c.Close
	return c, nil
}

// Start joins the group and returns once the consumer holds the queues of
// its first assignment. ctx bounds only this wait: when it is done first,
// Start returns ctx's error and the consumer goes on joining, running
// until Close (call Start again to wait once more). The topic must exist
// ([ErrTopicNotFound]); a member ID already in the group is
// [ErrInvalidOption]; a Close before or during Start makes it
// [ErrClosed]. Starting a started consumer waits as the first Start does.
// If the allocator's first split is broken, Start reports it (see
// [WithOnError]) and does not wait for the locks.
func (c *Consumer) Start(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "start consumer", Err: err}
	}
	if err := c.createDeadLetter(ctx); err != nil {
		return &Error{Op: fmt.Sprintf("start consumer: dead-letter topic %q", c.m.cfg.deadLetter), Err: err}
	}
	err := c.m.start(ctx, func() {
		d := newDeliverer(c.m, c.h)
		if c.m.cfg.retryOf == "" && c.m.offQueue() {
			d.c = c
		}
		c.d.Store(d)
		c.m.dropRetries = d.dropRetries
		// Workers start on demand, up to the concurrency, and retire
		// when idle (see scheduler); the retry loop with the first retry.
		c.m.sched.spawn = func() { go d.work() }
		c.m.sched.inline = d.workInline
		c.m.sched.wg = &c.m.wg
		c.m.sched.max = c.m.cfg.concurrency
	})
	if err != nil {
		return &Error{Op: "start consumer", Err: err}
	}
	if c.m.cfg.retryOf == "" && c.m.offQueue() {
		if err := c.ensureRetry(ctx, false); err != nil {
			c.m.report(err)
		}
	}
	return nil
}

// createDeadLetter creates the dead-letter topic (one queue) if it does
// not exist, so that a reader of dead letters started with the consumer
// finds it.
func (c *Consumer) createDeadLetter(ctx context.Context) error {
	err := c.m.createDeadLetter(ctx)
	if errors.Is(err, ErrClosed) {
		return nil // start says so
	}
	return err
}

// createDeadLetter creates the member's dead-letter topic (one queue) if
// it does not exist: a system topic for the default name, a user topic
// for one named with WithDeadLetter. One that exists with other metadata
// is used as it is.
func (m *groupMember) createDeadLetter(ctx context.Context) error {
	b := m.b
	name := m.cfg.deadLetter
	if _, ok := b.Topic(name); ok {
		return nil
	}
	if IsSystemTopic(name) {
		return b.createSystemTopic(ctx, TopicMeta{Name: name, Queues: 1})
	}
	err := b.CreateTopic(ctx, TopicMeta{Name: name, Queues: 1})
	if err != nil && !errors.Is(err, ErrTopicExists) {
		return err
	}
	return nil
}

// Close stops fetching, leaves the group, lets in-flight handlers finish
// up to the drain timeout (then cancels their context; unfinished
// messages go to the next owner), commits, unlocks the queues and returns
// once every goroutine the consumer started has returned, including
// handlers that ignore their context, so a handler must not call it. It
// returns what failed while closing (a final cursor commit, say), joined,
// and the same again on every later call.
func (c *Consumer) Close() error {
	c.retryMu.Lock()
	c.closing = true
	c.retryMu.Unlock()
	err := c.m.close()
	c.retryMu.Lock()
	rc := c.retry
	c.retryMu.Unlock()
	if rc != nil {
		err = joinErrors(err, rc.Close())
	}
	if d := c.deliverer(); d != nil {
		d.mu.Lock()
		p := d.outbox
		d.mu.Unlock()
		if p != nil {
			_ = p.Close()
		}
	}
	return err
}

// Assigned returns the queues the consumer holds now, sorted.
func (c *Consumer) Assigned() []QueueID { return c.m.assigned() }

// Pause stops fetching and handling the given queues, or every queue the
// consumer holds or will hold when none is given (a database is down,
// say): no handler call starts for them, those in flight finish, fetched
// messages wait in the buffer, and the queues stay owned, so the group
// does not rebalance. Resume goes on from the same place. Pausing a
// paused queue does nothing; a queue of another topic is
// [ErrInvalidOption] and nothing changes.
func (c *Consumer) Pause(queues ...QueueID) error {
	if err := c.m.pause(true, queues); err != nil {
		return &Error{Op: "pause", Err: err}
	}
	c.pauseRetries()
	return nil
}

// pauseRetries makes the retry reader's queues paused as the consumer's
// are (see groupMember.pausesRetryQueue).
func (c *Consumer) pauseRetries() {
	c.retryMu.Lock()
	rc := c.retry
	c.retryMu.Unlock()
	if rc != nil {
		rc.m.repause()
	}
}

// Resume undoes [Consumer.Pause] for the given queues, or for every queue
// when none is given.
func (c *Consumer) Resume(queues ...QueueID) error {
	if err := c.m.pause(false, queues); err != nil {
		return &Error{Op: "resume", Err: err}
	}
	c.pauseRetries()
	return nil
}

// Paused returns the queues the consumer holds and has paused, sorted.
func (c *Consumer) Paused() []QueueID { return c.m.pausedQueues() }

// Seek moves the queues the consumer holds as to says (the earliest, the
// latest, offsets of some queues, or a time), at runtime, in offset
// order: no message of a queue is handed out from when Seek is called
// until its move is done, the messages in flight finish first (their
// commits count), the buffered rest is dropped, and the cursor is
// committed at the new place, from which handling goes on. A queue named
// in [ResetToOffsets] that the consumer does not hold is
// [ErrInvalidOption], an offset outside its queue's retained range
// [ErrOffsetOutOfRange], and then nothing moves. ctx bounds the wait only.
// A queue given up meanwhile (a rebalance) reports [ErrClosed]: its next
// owner starts from the cursor as it was.
func (c *Consumer) Seek(ctx context.Context, to ResetTo) error {
	if err := c.m.seek(ctx, to); err != nil {
		return &Error{Op: "seek", Err: err}
	}
	return nil
}

// Group returns the consumer's group.
func (c *Consumer) Group() string { return c.m.group }

// MemberID returns the consumer's ID in its group (see [WithMemberID]).
func (c *Consumer) MemberID() string { return c.m.cfg.memberID }
