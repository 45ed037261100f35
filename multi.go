package ferry

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"
)

// MultiConsumer is a push consumer over several topics, for one group
// and one handler (RocketMQ's multi-topic groups, franz-go's regex
// consumption): a member of the group on each topic, so each topic's
// queues are split among the group's members as for a [Consumer], with
// cursors, retries, [Broker.Lag] and callbacks per topic as today. The
// handler tells the topics apart by [Message.Topic]. A pattern
// ([Broker.NewPatternConsumer]) follows the topics as they are created
// and deleted.
type MultiConsumer struct {
	b       *Broker
	group   string
	h       Handler
	opts    []ConsumerOption
	pattern *regexp.Regexp
	every   time.Duration

	mu        sync.Mutex
	consumers map[string]*Consumer
	started   bool
	closed    bool
	err       func(error)

	stop chan struct{}
	wg   sync.WaitGroup
}

// NewMultiConsumer makes a consumer of group over topics (at least one,
// no repeats), each as [Broker.NewConsumer] would make it with h and
// opts, and the same errors.
func (b *Broker) NewMultiConsumer(group string, topics []string, h Handler, opts ...ConsumerOption) (*MultiConsumer, error) {
	if len(topics) == 0 {
		return nil, &Error{Op: "new multi-topic consumer", Err: fmt.Errorf("%w: no topic", ErrInvalidOption)}
	}
	mc := newMulti(b, group, h, opts)
	for i, t := range topics {
		if slices.Contains(topics[:i], t) {
			return nil, &Error{Op: "new multi-topic consumer", Err: fmt.Errorf("%w: topic %q twice", ErrInvalidOption, t)}
		}
		if err := mc.add(t); err != nil {
			return nil, err
		}
	}
	return mc, nil
}

// PatternPollInterval is how often a pattern consumer looks for topics
// created or deleted (in this broker or another sharing its storage).
const PatternPollInterval = time.Second

// NewPatternConsumer makes a consumer of group over every topic whose
// name matches pattern (system topics aside), now and as topics are
// created and deleted: it looks at the storage's topics when it starts
// and every [PatternPollInterval] after, joining the group on a new
// topic and leaving a deleted one (its consumer closed; its cursors
// stay). A nil pattern is [ErrInvalidOption]; a matching topic whose
// consumer cannot be made is reported through [WithOnError] and tried
// again at the next look.
func (b *Broker) NewPatternConsumer(group string, pattern *regexp.Regexp, h Handler, opts ...ConsumerOption) (*MultiConsumer, error) {
	if pattern == nil {
		return nil, &Error{Op: "new pattern consumer", Err: fmt.Errorf("%w: nil pattern", ErrInvalidOption)}
	}
	if h == nil {
		return nil, &Error{Op: "new pattern consumer", Err: fmt.Errorf("%w: nil handler", ErrInvalidOption)}
	}
	// The options are checked once, as for a topic of the pattern.
	if _, err := newConsumerConfig(group, "pattern", func(c *consumerConfig) {
		for _, o := range opts {
			if o != nil {
				o.applyConsumer(c)
			}
		}
	}); err != nil {
		return nil, &Error{Op: "new pattern consumer", Err: err}
	}
	mc := newMulti(b, group, h, opts)
	mc.pattern, mc.every = pattern, PatternPollInterval
	return mc, nil
}

func newMulti(b *Broker, group string, h Handler, opts []ConsumerOption) *MultiConsumer {
	mc := &MultiConsumer{b: b, group: group, h: h, opts: opts, consumers: map[string]*Consumer{}, stop: make(chan struct{})}
	var cfg consumerConfig
	for _, o := range opts {
		if o != nil {
			o.applyConsumer(&cfg)
		}
	}
	mc.err = cfg.onError
	return mc
}

// add makes topic's consumer. mc.mu not held.
func (mc *MultiConsumer) add(topic string) error {
	c, err := mc.b.NewConsumer(mc.group, topic, mc.h, mc.opts...)
	if err != nil {
		return err
	}
	mc.mu.Lock()
	mc.consumers[topic] = c
	mc.mu.Unlock()
	return nil
}

// Start starts the consumer of every topic (see [Consumer.Start]) and,
// for a pattern, the look for topics; an error of one closes those
// started and is returned.
func (mc *MultiConsumer) Start(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "start", Err: err}
	}
	mc.mu.Lock()
	if mc.closed {
		mc.mu.Unlock()
		return &Error{Op: "start", Err: ErrClosed}
	}
	if mc.started {
		mc.mu.Unlock()
		return &Error{Op: "start", Err: fmt.Errorf("%w: started already", ErrInvalidOption)}
	}
	mc.started = true
	cs := mc.list()
	mc.mu.Unlock()
	for _, c := range cs {
		if err := c.Start(ctx); err != nil {
			_ = mc.Close()
			return err
		}
	}
	if mc.pattern != nil {
		mc.look(ctx)
		mc.wg.Go(mc.watch)
	}
	return nil
}

// list returns the consumers, by topic. mc.mu held.
func (mc *MultiConsumer) list() []*Consumer {
	names := make([]string, 0, len(mc.consumers))
	for t := range mc.consumers {
		names = append(names, t)
	}
	slices.Sort(names)
	cs := make([]*Consumer, len(names))
	for i, t := range names {
		cs[i] = mc.consumers[t]
	}
	return cs
}

func (mc *MultiConsumer) watch() {
	t := time.NewTicker(mc.every)
	defer t.Stop()
	for {
		select {
		case <-mc.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), mc.every*5)
		mc.look(ctx)
		cancel()
	}
}

// look compares the storage's topics with the pattern's consumers: it
// starts one for each new match and closes those of topics gone.
func (mc *MultiConsumer) look(ctx context.Context) {
	metas, err := mc.b.storage.Topics(ctx)
	if err != nil {
		mc.report(&Error{Op: "pattern consumer: list topics", Err: err})
		return
	}
	want := map[string]bool{}
	for _, m := range metas {
		if !IsSystemTopic(m.Name) && mc.pattern.MatchString(m.Name) {
			want[m.Name] = true
		}
	}
	mc.mu.Lock()
	var gone []*Consumer
	for t, c := range mc.consumers {
		if !want[t] {
			gone = append(gone, c)
			delete(mc.consumers, t)
		}
	}
	var added []string
	for t := range want {
		if _, ok := mc.consumers[t]; !ok {
			added = append(added, t)
		}
	}
	closed := mc.closed
	mc.mu.Unlock()
	for _, c := range gone {
		if err := c.Close(); err != nil {
			mc.report(err)
		}
	}
	if closed {
		return
	}
	slices.Sort(added)
	for _, t := range added {
		c, err := mc.b.NewConsumer(mc.group, t, mc.h, mc.opts...)
		if err == nil {
			err = c.Start(ctx)
		}
		if err != nil {
			if c != nil {
				_ = c.Close()
			}
			mc.report(&Error{Op: fmt.Sprintf("pattern consumer: topic %q", t), Err: err})
			continue
		}
		mc.mu.Lock()
		if mc.closed {
			mc.mu.Unlock()
			_ = c.Close()
			return
		}
		mc.consumers[t] = c
		mc.mu.Unlock()
	}
}

func (mc *MultiConsumer) report(err error) {
	if mc.err != nil {
		mc.err(err)
	}
}

// Close stops the look for topics and closes every topic's consumer
// (each drains and commits); idempotent.
func (mc *MultiConsumer) Close() error {
	mc.mu.Lock()
	if mc.closed {
		mc.mu.Unlock()
		return nil
	}
	mc.closed = true
	close(mc.stop)
	mc.mu.Unlock()
	mc.wg.Wait()
	mc.mu.Lock()
	cs := mc.list()
	mc.mu.Unlock()
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return joinErrors(errs...)
}

// Topics returns the topics consumed now, sorted.
func (mc *MultiConsumer) Topics() []string {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	out := make([]string, 0, len(mc.consumers))
	for t := range mc.consumers {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// Consumer returns the consumer of topic, and false when there is none.
func (mc *MultiConsumer) Consumer(topic string) (*Consumer, bool) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	c, ok := mc.consumers[topic]
	return c, ok
}

// Assigned returns the queues held, of every topic, sorted.
func (mc *MultiConsumer) Assigned() []QueueID {
	mc.mu.Lock()
	cs := mc.list()
	mc.mu.Unlock()
	var out []QueueID
	for _, c := range cs {
		out = append(out, c.Assigned()...)
	}
	return out
}

// Stats returns each topic's consumer's statistics, by topic.
func (mc *MultiConsumer) Stats() map[string]ConsumerStats {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	out := make(map[string]ConsumerStats, len(mc.consumers))
	for t, c := range mc.consumers {
		out[t] = c.Stats()
	}
	return out
}

// Pause pauses the given queues, each through its topic's consumer, or
// every queue when none is given (see [Consumer.Pause]); a queue of a
// topic not consumed is [ErrInvalidOption] and nothing changes.
func (mc *MultiConsumer) Pause(queues ...QueueID) error {
	return mc.each("pause", queues, (*Consumer).Pause)
}

// Resume undoes Pause (see [Consumer.Resume]).
func (mc *MultiConsumer) Resume(queues ...QueueID) error {
	return mc.each("resume", queues, (*Consumer).Resume)
}

func (mc *MultiConsumer) each(op string, queues []QueueID, f func(*Consumer, ...QueueID) error) error {
	mc.mu.Lock()
	byTopic := map[*Consumer][]QueueID{}
	for _, q := range queues {
		c, ok := mc.consumers[q.Topic]
		if !ok {
			mc.mu.Unlock()
			return &Error{Op: op, Err: fmt.Errorf("%w: queue %s of a topic not consumed", ErrInvalidOption, q)}
		}
		byTopic[c] = append(byTopic[c], q)
	}
	cs := mc.list()
	mc.mu.Unlock()
	var errs []error
	for _, c := range cs {
		if len(queues) == 0 {
			errs = append(errs, f(c))
		} else if qs := byTopic[c]; len(qs) > 0 {
			errs = append(errs, f(c, qs...))
		}
	}
	return joinErrors(errs...)
}
