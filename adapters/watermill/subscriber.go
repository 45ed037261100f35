package ferrywm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ferrymq/ferry"
)

// Subscriber defaults.
const (
	// DefaultRetryBackoff is the wait before a nacked message comes again.
	DefaultRetryBackoff = 10 * time.Millisecond
	// DefaultMaxRetryBackoff caps the wait as it doubles on every Nack of
	// the same message (Watermill's Kafka subscriber waits 100ms).
	DefaultMaxRetryBackoff = 100 * time.Millisecond
)

// SubscriberConfig configures a [Subscriber]. Zero fields take their
// defaults.
type SubscriberConfig struct {
	// ConsumerGroup is the Ferry consumer group of every subscription:
	// the subscriptions of a group, in this subscriber or others, share
	// each message once. Empty gives each Subscribe call a group of its
	// own ("watermill-<uuid>"), so it reads the whole topic; the cursors of
	// such groups stay in the cursor store.
	ConsumerGroup string
	// Queues is the queue count of a topic Subscribe creates. Default
	// [DefaultQueues].
	Queues int
	// Retention bounds each queue of a topic Subscribe creates.
	Retention ferry.Retention
	// StartFrom is where a group with no committed cursor starts. Default
	// [ferry.Earliest]: messages published before the first Subscribe
	// are delivered. With [ferry.Latest] a group starts where each queue
	// ends when its subscription takes it, which is after Subscribe
	// returns: messages published in between are skipped.
	StartFrom ferry.StartFrom
	// MaxAttempts bounds the deliveries of a message that keeps being
	// nacked; after the last it goes to the group's dead-letter topic (see
	// [ferry.WithDeadLetter], settable through ConsumerOptions). The count
	// travels with the message through the group's retry topic, so it
	// goes on across subscriptions and restarts. Default: unlimited, as
	// Watermill expects a nacked message back until it is acked.
	MaxAttempts int
	// RetryBackoff is the wait before a nacked message comes again; it
	// doubles on every Nack of the same message up to MaxRetryBackoff.
	// It runs on the broker's clock ([ferry.WithClock]). Default
	// [DefaultRetryBackoff].
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the doubling wait. Default
	// [DefaultMaxRetryBackoff].
	MaxRetryBackoff time.Duration
	// DrainTimeout bounds how long a queue moving to another member of the
	// group (a subscriber joining or leaving) waits for the Ack of a
	// message in flight; after it the message is delivered again by the
	// queue's next owner. Default [ferry.DefaultDrainTimeout]. A
	// subscription that ends does not wait: its unacked message goes to
	// the next owner at once.
	DrainTimeout time.Duration
	// ConsumerOptions are passed to [ferry.Broker.NewConsumer] (a member
	// ID, a dead-letter topic, an allocator, buffer sizes, WithOnError).
	// They override the fields above, but not [ferry.WithConcurrency](1),
	// which always applies. [ferry.Ordered] here makes a nacked message
	// wait out its backoff in its queue, holding back the messages after
	// it, instead of going through the group's retry topic: per-key order
	// then holds through Nacks too (see the package doc).
	ConsumerOptions []ferry.ConsumerOption
	// Logger logs subscriptions that end on an error. Default: none.
	Logger watermill.LoggerAdapter
}

// Subscriber subscribes to a Ferry broker's topics for Watermill. It is
// safe for concurrent use. Each Subscribe starts goroutines (those of a
// [ferry.Consumer] and one that ends the subscription), which Close, or
// the cancellation of the Subscribe context, stops and waits for.
type Subscriber struct {
	b      *ferry.Broker
	cfg    SubscriberConfig
	topics topicCache

	mu     sync.Mutex // guards closed and subs
	closed bool
	subs   map[*subscription]struct{}
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a subscriber over b, which stays the caller's to
// close. A nil broker or a value out of range is [ferry.ErrInvalidOption].
func NewSubscriber(b *ferry.Broker, cfg SubscriberConfig) (*Subscriber, error) {
	switch {
	case b == nil:
		return nil, fmt.Errorf("ferrywm: new subscriber: %w: nil broker", ferry.ErrInvalidOption)
	case cfg.Queues < 0:
		return nil, fmt.Errorf("ferrywm: new subscriber: %w: queues %d", ferry.ErrInvalidOption, cfg.Queues)
	case cfg.MaxAttempts < 0:
		return nil, fmt.Errorf("ferrywm: new subscriber: %w: max attempts %d", ferry.ErrInvalidOption, cfg.MaxAttempts)
	case cfg.RetryBackoff < 0 || cfg.MaxRetryBackoff < 0 || cfg.DrainTimeout < 0:
		return nil, fmt.Errorf("ferrywm: new subscriber: %w: negative duration", ferry.ErrInvalidOption)
	}
	if cfg.Queues == 0 {
		cfg.Queues = DefaultQueues
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = math.MaxInt
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	if cfg.MaxRetryBackoff == 0 {
		cfg.MaxRetryBackoff = max(DefaultMaxRetryBackoff, cfg.RetryBackoff)
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = ferry.DefaultDrainTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	// Check the group and the options now rather than on every Subscribe.
	group := cfg.ConsumerGroup
	if group == "" {
		group = "watermill-check"
	}
	c, err := b.NewConsumer(group, "check", nopHandler, consumerOptions(cfg)...)
	if err != nil {
		return nil, fmt.Errorf("ferrywm: new subscriber: %w", err)
	}
	_ = c.Close() // never started: nothing to stop
	return &Subscriber{b: b, cfg: cfg, subs: map[*subscription]struct{}{}}, nil
}

var nopHandler = ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })

func consumerOptions(cfg SubscriberConfig) []ferry.ConsumerOption {
	opts := []ferry.ConsumerOption{
		ferry.WithRetry(cfg.MaxAttempts, cfg.RetryBackoff),
		ferry.WithMaxRetryBackoff(cfg.MaxRetryBackoff),
		ferry.WithDrainTimeout(cfg.DrainTimeout),
		ferry.WithStartFrom(cfg.StartFrom),
	}
	opts = append(opts, cfg.ConsumerOptions...)
	return append(opts, ferry.WithConcurrency(1))
}

// Subscribe returns a channel of topic's messages for the subscriber's
// consumer group, creating the topic on first use. The subscription joins
// the group in the background; it ends, and the channel closes, when ctx
// is cancelled or the subscriber closes. Every message must be acked or
// nacked before the next one comes. After Close it returns an error
// wrapping [ferry.ErrClosed]; a nil ctx is [ferry.ErrInvalidOption].
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if ctx == nil {
		return nil, fmt.Errorf("ferrywm: subscribe to %q: %w: nil context", topic, ferry.ErrInvalidOption)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("ferrywm: subscribe to %q: %w", topic, ferry.ErrClosed)
	}
	if err := s.topics.ensure(ctx, s.b, ferry.TopicMeta{Name: topic, Queues: s.cfg.Queues, Retention: s.cfg.Retention}); err != nil {
		return nil, fmt.Errorf("ferrywm: subscribe to %q: %w", topic, err)
	}
	group := s.cfg.ConsumerGroup
	if group == "" {
		group = "watermill-" + watermill.NewUUID()
	}
	sctx, cancel := context.WithCancel(ctx)
	sub := &subscription{
		b:         s.b,
		ephemeral: s.cfg.ConsumerGroup == "",
		topic:     topic,
		group:     group,
		out:       make(chan *message.Message),
		turn:      make(chan struct{}, 1),
		ctx:       sctx,
		cancel:    cancel,
		done:      make(chan struct{}),
		log:       s.cfg.Logger,
	}
	c, err := s.b.NewConsumer(group, topic, ferry.HandlerFunc(sub.handle), consumerOptions(s.cfg)...)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("ferrywm: subscribe to %q: %w", topic, err)
	}
	sub.c = c
	s.subs[sub] = struct{}{}
	go func() {
		defer close(sub.done) // last: Close waits for this goroutine to end
		sub.run()
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()
	return sub.out, nil
}

// SubscribeInitialize creates topic unless it exists, as Watermill's
// [message.SubscribeInitializer] asks.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := s.topics.ensure(context.Background(), s.b, ferry.TopicMeta{Name: topic, Queues: s.cfg.Queues, Retention: s.cfg.Retention}); err != nil {
		return fmt.Errorf("ferrywm: initialize %q: %w", topic, err)
	}
	return nil
}

var _ message.SubscribeInitializer = (*Subscriber)(nil)

// Close ends every subscription (cancelling the context of the messages in
// flight, which are delivered again to the group) and returns once their
// consumers have left the group and their channels are closed. It is
// idempotent, returns nil and leaves the broker open.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	for _, sub := range subs {
		sub.cancel()
	}
	for _, sub := range subs {
		<-sub.done
	}
	return nil
}

// errNacked is what the handler returns for a nacked message: Ferry
// writes it to the group's retry topic, due after the backoff (in place
// with [ferry.Ordered]).
var errNacked = errors.New("ferrywm: message nacked")

// errStopped is what the handler returns when its subscription ends before
// the message is acked. Ferry has no way for a handler to give a message
// back unattempted, so this is a failed attempt, as a Nack is: the
// message goes to the retry topic, due after the backoff, for the group's
// next reader of it (with [ferry.Ordered], to the queue's next owner).
var errStopped = errors.New("ferrywm: subscription ended")

// subscription is one Subscribe call: a consumer handing messages to out.
type subscription struct {
	b            *ferry.Broker
	ephemeral    bool // a group of its own, which ends with the subscription
	topic, group string
	c            *ferry.Consumer
	out          chan *message.Message
	// turn is held by the handler call whose message is out, from before
	// it is sent until its Ack or Nack: the consumer runs one call at a
	// time on the topic and one on its retry topic, and the subscription
	// hands out one message at a time.
	turn   chan struct{}
	ctx    context.Context // the Subscribe context; cancelled to end
	cancel context.CancelFunc
	done   chan struct{} // closed once out is closed and the subscription forgotten
	log    watermill.LoggerAdapter
}

// run starts the consumer, waits for the end of the subscription, closes
// the consumer and then the channel.
func (sub *subscription) run() {
	if err := sub.c.Start(sub.ctx); err != nil && sub.ctx.Err() == nil {
		sub.log.Error("ferrywm: subscription failed", err, watermill.LogFields{"topic": sub.topic, "group": sub.group})
		sub.cancel()
	}
	<-sub.ctx.Done()
	// No handler call starts after this (one would count an attempt and
	// go through the retry topic); those in flight return at once, as
	// they watch sub.ctx.
	_ = sub.c.Pause()
	_ = sub.c.Close()
	if sub.ephemeral {
		// Nobody comes back to this group: it must not hold back a topic
		// with Block overflow. Its cursor stays in the cursor store.
		// sub.ctx is done: what it carries goes on, not its end.
		if err := sub.b.ForgetGroup(context.WithoutCancel(sub.ctx), sub.group, sub.topic); err != nil && !errors.Is(err, ferry.ErrClosed) {
			sub.log.Error("ferrywm: forgetting the subscription's group", err, watermill.LogFields{"topic": sub.topic, "group": sub.group})
		}
	}
	close(sub.out)
}

// handle hands one message to the subscription's channel and waits for
// its Ack (nil) or Nack (an error: Ferry delivers it again after the
// backoff). It takes the subscription's turn first, so a subscription has
// at most one message out.
func (sub *subscription) handle(hctx context.Context, em *ferry.EnhancedMessage) error {
	if sub.ctx.Err() != nil {
		return errStopped // ending: hand out nothing more
	}
	select {
	case sub.turn <- struct{}{}:
	case <-sub.ctx.Done():
		return errStopped
	case <-hctx.Done():
		return hctx.Err()
	}
	defer func() { <-sub.turn }()
	d, _ := ferry.DeliveryFrom(hctx)
	msg := unmarshal(em, d)
	mctx, cancel := context.WithCancel(context.WithValue(sub.ctx, deliveryKey{}, d))
	defer cancel() // after Ack or Nack, and when the subscription ends
	msg.SetContext(mctx)
	select {
	case sub.out <- msg:
	case <-sub.ctx.Done():
		return errStopped
	case <-hctx.Done():
		return hctx.Err()
	}
	select {
	case <-msg.Acked():
		return nil
	case <-msg.Nacked():
		return errNacked
	case <-sub.ctx.Done():
		return settled(msg, errStopped)
	case <-hctx.Done(): // the queue moved on after the drain timeout
		return settled(msg, hctx.Err())
	}
}

// settled returns what msg's Ack or Nack says if either came (a select
// picks at random among ready cases, so an Ack may race the end of the
// subscription, and an acked message must not come again), else err.
func settled(msg *message.Message, err error) error {
	select {
	case <-msg.Acked():
		return nil
	case <-msg.Nacked():
		return errNacked
	default:
		return err
	}
}

// unmarshal turns a stored message into a fresh Watermill message. The
// body is copied: the stored one is shared with every group. A message
// that comes back from the group's retry topic carries the headers Ferry
// added on the way (its attempts, origin, last error, due time): they are
// dropped, so that the metadata are the ones published.
func unmarshal(em *ferry.EnhancedMessage, d ferry.Delivery) *message.Message {
	md := make(message.Metadata, len(em.Headers))
	maps.Copy(md, em.Headers)
	if retried(em, d) {
		for _, h := range retryHeaders {
			delete(md, h)
		}
	}
	uuid := md[UUIDHeader]
	delete(md, UUIDHeader)
	msg := message.NewMessage(uuid, append([]byte(nil), em.Body...))
	msg.Metadata = md
	return msg
}

// retryHeaders are the headers Ferry sets on a message it writes to a
// retry topic.
var retryHeaders = []string{
	ferry.HeaderAttempts, ferry.HeaderError, ferry.HeaderGroup,
	ferry.HeaderOriginTopic, ferry.HeaderOriginQueue, ferry.HeaderOriginOffset, ferry.HeaderOriginID,
	ferry.HeaderDeliverAt,
}

// retried reports whether em comes from the group's retry topic: it
// carries the attempts made before this one, written there by the group.
func retried(em *ferry.EnhancedMessage, d ferry.Delivery) bool {
	return d.Attempt > 1 && em.Headers[ferry.HeaderAttempts] == strconv.Itoa(d.Attempt-1) &&
		em.Headers[ferry.HeaderGroup] == d.Group
}

type deliveryKey struct{}

// DeliveryFrom returns the [ferry.Delivery] of a subscribed message, given
// its context (msg.Context(), or one derived from it): its consumer
// group and member, its attempt number from 1, counted across Nacks,
// subscriptions and restarts, and the attempts allowed
// ([SubscriberConfig.MaxAttempts], [math.MaxInt] for unlimited). It
// reports false for any other context, a nil one included.
func DeliveryFrom(ctx context.Context) (ferry.Delivery, bool) {
	if ctx == nil {
		return ferry.Delivery{}, false
	}
	d, ok := ctx.Value(deliveryKey{}).(ferry.Delivery)
	return d, ok
}
