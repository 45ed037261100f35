package ferry

import (
	"context"
	"fmt"
	"iter"
	"sync"
)

// PullConsumer is a member of a consumer group that the caller pulls
// messages from, instead of giving a handler. It shares the group
// machinery of [Consumer]: membership, allocation, queue locks, buffers
// and flow control, cursors. A polled message is in flight until it is
// committed; the cursor of a queue moves to its smallest unfinished
// offset, so a message polled and never committed is delivered again
// after a rebalance or restart (and holds the queue's flow control
// meanwhile: see [WithMaxSpan]).
//
// Start (or the first Poll) joins the group; the fetch loops, the
// committer and the membership loop run as for a [Consumer], only while
// they have work. Close stops them and waits. A PullConsumer is safe for
// concurrent use.
type PullConsumer struct {
	m *groupMember

	mu   sync.Mutex // guards last
	last []*EnhancedMessage
}

// NewPullConsumer returns a pull consumer for topic in group. It takes
// every [GroupOption] and [WithAutoCommit]; the push-only options
// (Ordered, WithConcurrency, WithRetry, WithMaxRetryBackoff,
// WithDeadLetter) are [ConsumerOption]s, which it does not take. Bad
// names and option values are as for [Broker.NewConsumer].
func (b *Broker) NewPullConsumer(group, topic string, opts ...PullConsumerOption) (*PullConsumer, error) {
	cfg, err := newConsumerConfig(group, topic, func(c *consumerConfig) {
		for _, o := range opts {
			if o != nil {
				o.applyPull(c)
			}
		}
	})
	if err != nil {
		return nil, &Error{Op: "new pull consumer", Err: err}
	}
	if b.closed.Load() {
		return nil, &Error{Op: "new pull consumer", Err: ErrClosed}
	}
	m := newGroupMember(b, group, topic, cfg)
	m.pull = true
	return &PullConsumer{m: m}, nil
}

// Start joins the group and returns once the consumer holds the queues of
// its first assignment; see [Consumer.Start]: ctx bounds only the wait,
// never the consumer. Poll and Messages call it if needed.
func (c *PullConsumer) Start(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "start pull consumer", Err: err}
	}
	if err := c.m.start(ctx, nil); err != nil {
		return &Error{Op: "start pull consumer", Err: err}
	}
	return nil
}

// Poll returns up to max messages, in offset order within each queue,
// waiting until there is at least one or ctx is done (ctx's error). It
// starts the consumer if needed. max < 1 is [ErrInvalidOption]; after
// Close it is [ErrClosed]. With [WithAutoCommit] it first marks the
// messages of earlier Polls finished. The caller owns the slice; the
// messages are shared with other groups and must not be modified.
func (c *PullConsumer) Poll(ctx context.Context, max int) ([]*EnhancedMessage, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "poll", Err: err}
	}
	if max < 1 {
		return nil, &Error{Op: "poll", Err: fmt.Errorf("%w: max %d", ErrInvalidOption, max)}
	}
	if err := c.Start(ctx); err != nil {
		return nil, &Error{Op: "poll", Err: err}
	}
	c.finishLast()
	// One Poll takes from one queue's buffer, which never holds more than
	// its capacity: a larger slice would go unused (or not fit in memory).
	out := make([]*EnhancedMessage, min(max, c.m.cfg.buffer.MaxMessages))
	n, err := c.poll(ctx, out)
	if err != nil {
		return nil, &Error{Op: "poll", Err: err}
	}
	out = out[:n:n]
	if c.m.cfg.autoCommit {
		c.mu.Lock()
		c.last = append(c.last, out...)
		c.mu.Unlock()
	}
	return out, nil
}

// poll fills dst from one queue with pending messages.
func (c *PullConsumer) poll(ctx context.Context, dst []*EnhancedMessage) (int, error) {
	m := c.m
	for {
		r, _ := m.sched.next(ctx, m.halt, nil)
		if r == nil {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			return 0, ErrClosed
		}
		if r.expired() {
			continue // the lease may have expired: the queue is lost
		}
		n, pending := r.buf.Take(dst)
		if pending > 0 {
			m.sched.push(r)
		}
		if n > 0 {
			return n, nil
		}
	}
}

// finishLast marks the messages of earlier Polls finished, with
// WithAutoCommit.
func (c *PullConsumer) finishLast() {
	if !c.m.cfg.autoCommit {
		return
	}
	c.mu.Lock()
	last := c.last
	c.last = nil
	c.mu.Unlock()
	c.finish(last)
}

// finish marks msgs finished in their queues' buffers and returns the
// runs touched.
func (c *PullConsumer) finish(msgs []*EnhancedMessage) []*queueRun {
	if len(msgs) == 0 {
		return nil
	}
	m := c.m
	var touched []*queueRun
	m.mu.Lock()
	for _, msg := range msgs {
		if msg == nil || msg.Topic != m.topic {
			continue
		}
		if r := m.runs[msg.Queue]; r != nil && !r.finished.Load() {
			r.buf.Done(msg)
			m.handled.Add(1)
			if len(touched) == 0 || touched[len(touched)-1] != r {
				touched = append(touched, r)
			}
		}
	}
	m.mu.Unlock()
	m.markDirty()
	return touched
}

// Commit marks msgs finished and commits the cursors of their queues now:
// each moves to its queue's smallest unfinished offset, so committing out
// of order never skips a message. Messages of queues the consumer no
// longer holds are ignored (the next owner delivers them again). After
// Close it is [ErrClosed].
func (c *PullConsumer) Commit(ctx context.Context, msgs ...*EnhancedMessage) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "commit", Err: err}
	}
	c.m.mu.Lock()
	closed := c.m.state == memberClosed
	c.m.mu.Unlock()
	if closed {
		return &Error{Op: "commit", Err: ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "commit", Err: err}
	}
	var errs []error
	for _, r := range c.finish(msgs) {
		errs = append(errs, r.commit(false))
	}
	return joinErrors(errs...)
}

// Messages returns an iterator over the consumer's messages, one at a
// time, until ctx is done or the consumer is closed; it then yields the
// error (ctx's, or [ErrClosed]) and stops. With [WithAutoCommit] each
// message is marked finished once the loop body is done with it
// (including when the body breaks out of the loop); otherwise call
// [PullConsumer.Commit].
func (c *PullConsumer) Messages(ctx context.Context) iter.Seq2[*EnhancedMessage, error] {
	return func(yield func(*EnhancedMessage, error) bool) {
		if err := checkContext(ctx); err != nil {
			yield(nil, &Error{Op: "messages", Err: err})
			return
		}
		if err := c.Start(ctx); err != nil {
			yield(nil, &Error{Op: "messages", Err: err})
			return
		}
		var one [1]*EnhancedMessage
		for {
			if _, err := c.poll(ctx, one[:]); err != nil {
				yield(nil, &Error{Op: "messages", Err: err})
				return
			}
			more := yield(one[0], nil)
			if c.m.cfg.autoCommit {
				c.finish(one[:])
			}
			one[0] = nil
			if !more {
				return
			}
		}
	}
}

// Assigned returns the queues the consumer holds now, sorted.
func (c *PullConsumer) Assigned() []QueueID { return c.m.assigned() }

// Pause stops fetching the given queues, or every queue when none is
// given, and Poll returns none of their messages until Resume; the
// queues stay owned. See [Consumer.Pause].
func (c *PullConsumer) Pause(queues ...QueueID) error {
	if err := c.m.pause(true, queues); err != nil {
		return &Error{Op: "pause", Err: err}
	}
	return nil
}

// Resume undoes [PullConsumer.Pause] for the given queues, or for every
// queue when none is given.
func (c *PullConsumer) Resume(queues ...QueueID) error {
	if err := c.m.pause(false, queues); err != nil {
		return &Error{Op: "resume", Err: err}
	}
	return nil
}

// Paused returns the queues the consumer holds and has paused, sorted.
func (c *PullConsumer) Paused() []QueueID { return c.m.pausedQueues() }

// Seek moves the queues the consumer holds as to says; see
// [Consumer.Seek]. Messages polled and not committed are let go: a later
// Commit of them is ignored.
func (c *PullConsumer) Seek(ctx context.Context, to ResetTo) error {
	if err := c.m.seek(ctx, to); err != nil {
		return &Error{Op: "seek", Err: err}
	}
	return nil
}

// Group returns the consumer's group.
func (c *PullConsumer) Group() string { return c.m.group }

// MemberID returns the consumer's ID in its group.
func (c *PullConsumer) MemberID() string { return c.m.cfg.memberID }

// Close leaves the group and releases its queues: with [WithAutoCommit]
// the messages of the last Poll count as finished; messages polled and
// not committed are left to the next owner at once (a rebalance, unlike
// Close, waits for them up to the drain timeout). It returns when every
// goroutine the consumer started has returned. Idempotent; returns nil.
func (c *PullConsumer) Close() error {
	c.finishLast()
	return c.m.close()
}
