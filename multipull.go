package ferry

import (
	"context"
	"fmt"
	"iter"
	"reflect"
	"slices"
)

// MultiPullConsumer is a pull consumer over several topics for one group
// (see [MultiConsumer] for the push side): a member of the group on each
// topic, cursors per topic; Poll takes from whichever topic has messages,
// turn by turn, so that none starves the others.
type MultiPullConsumer struct {
	subs []*PullConsumer // by topic
	turn int
}

// NewMultiPullConsumer makes a pull consumer of group over topics (at
// least one, no repeats), each as [Broker.NewPullConsumer] would make it
// with opts, and the same errors.
func (b *Broker) NewMultiPullConsumer(group string, topics []string, opts ...PullConsumerOption) (*MultiPullConsumer, error) {
	if len(topics) == 0 {
		return nil, &Error{Op: "new multi-topic pull consumer", Err: fmt.Errorf("%w: no topic", ErrInvalidOption)}
	}
	names := slices.Clone(topics)
	slices.Sort(names)
	for i := 1; i < len(names); i++ {
		if names[i] == names[i-1] {
			return nil, &Error{Op: "new multi-topic pull consumer", Err: fmt.Errorf("%w: topic %q twice", ErrInvalidOption, names[i])}
		}
	}
	mc := &MultiPullConsumer{}
	for _, t := range names {
		c, err := b.NewPullConsumer(group, t, opts...)
		if err != nil {
			_ = mc.Close()
			return nil, err
		}
		mc.subs = append(mc.subs, c)
	}
	return mc, nil
}

// Start starts every topic's consumer (see [PullConsumer.Start]).
func (mc *MultiPullConsumer) Start(ctx context.Context) error {
	for _, c := range mc.subs {
		if err := c.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Poll returns up to max messages of one queue of one of the topics, in
// offset order, waiting until there is one or ctx is done, as
// [PullConsumer.Poll] does. Poll is not safe for concurrent use with
// itself (its turn among the topics is the caller's).
func (mc *MultiPullConsumer) Poll(ctx context.Context, max int) ([]*EnhancedMessage, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "poll", Err: err}
	}
	if max < 1 {
		return nil, &Error{Op: "poll", Err: fmt.Errorf("%w: max %d", ErrInvalidOption, max)}
	}
	if err := mc.Start(ctx); err != nil {
		return nil, &Error{Op: "poll", Err: err}
	}
	for _, c := range mc.subs {
		c.finishLast()
	}
	out := make([]*EnhancedMessage, max)
	c, n, err := mc.take(ctx, out)
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

// take fills dst from one queue of one topic with pending messages,
// trying the topics from the next in turn, and waits for any of them when
// none has any.
func (mc *MultiPullConsumer) take(ctx context.Context, dst []*EnhancedMessage) (*PullConsumer, int, error) {
	var cases []reflect.SelectCase
	for {
		for k := range mc.subs {
			c := mc.subs[(mc.turn+k)%len(mc.subs)]
			r, _ := c.m.sched.take(false)
			if r == nil || r.expired() {
				continue
			}
			d := dst[:min(len(dst), c.m.cfg.buffer.MaxMessages)]
			n, pending := r.buf.Take(d)
			if pending > 0 {
				c.m.sched.push(r)
			}
			if n > 0 {
				mc.turn = (mc.turn + k + 1) % len(mc.subs)
				return c, n, nil
			}
		}
		if cases == nil {
			cases = make([]reflect.SelectCase, 0, 2*len(mc.subs)+1)
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
			for _, c := range mc.subs {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.m.sched.wake)},
					reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.m.halt)})
			}
		}
		i, _, _ := reflect.Select(cases)
		switch {
		case i == 0:
			return nil, 0, ctx.Err()
		case i%2 == 0: // a topic's consumer closed
			return nil, 0, ErrClosed
		}
	}
}

// Commit marks msgs finished and commits their cursors, each through its
// topic's consumer (see [PullConsumer.Commit]); a message of a topic not
// consumed is [ErrInvalidOption] and nothing is committed.
func (mc *MultiPullConsumer) Commit(ctx context.Context, msgs ...*EnhancedMessage) error {
	byTopic := map[*PullConsumer][]*EnhancedMessage{}
	for _, m := range msgs {
		if m == nil {
			continue
		}
		c := mc.sub(m.Topic)
		if c == nil {
			return &Error{Op: "commit", Err: fmt.Errorf("%w: a message of topic %q, not consumed", ErrInvalidOption, m.Topic)}
		}
		byTopic[c] = append(byTopic[c], m)
	}
	var errs []error
	for _, c := range mc.subs {
		if ms := byTopic[c]; len(ms) > 0 {
			errs = append(errs, c.Commit(ctx, ms...))
		}
	}
	return joinErrors(errs...)
}

func (mc *MultiPullConsumer) sub(topic string) *PullConsumer {
	i, ok := slices.BinarySearchFunc(mc.subs, topic, func(c *PullConsumer, t string) int {
		switch {
		case c.m.topic < t:
			return -1
		case c.m.topic > t:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return mc.subs[i]
}

// Messages returns an iterator over the messages of every topic, one at
// a time, as [PullConsumer.Messages] does for one.
func (mc *MultiPullConsumer) Messages(ctx context.Context) iter.Seq2[*EnhancedMessage, error] {
	return func(yield func(*EnhancedMessage, error) bool) {
		if err := checkContext(ctx); err != nil {
			yield(nil, &Error{Op: "messages", Err: err})
			return
		}
		if err := mc.Start(ctx); err != nil {
			yield(nil, &Error{Op: "messages", Err: err})
			return
		}
		var one [1]*EnhancedMessage
		for {
			c, _, err := mc.take(ctx, one[:])
			if err != nil {
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

// Topics returns the topics consumed, sorted.
func (mc *MultiPullConsumer) Topics() []string {
	out := make([]string, len(mc.subs))
	for i, c := range mc.subs {
		out[i] = c.m.topic
	}
	return out
}

// Assigned returns the queues held, of every topic, sorted.
func (mc *MultiPullConsumer) Assigned() []QueueID {
	var out []QueueID
	for _, c := range mc.subs {
		out = append(out, c.Assigned()...)
	}
	return out
}

// Close closes every topic's consumer; idempotent.
func (mc *MultiPullConsumer) Close() error {
	var errs []error
	for _, c := range mc.subs {
		errs = append(errs, c.Close())
	}
	return joinErrors(errs...)
}
