package ferrywm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ferrymq/ferry"
)

// DefaultQueues is the queue count of a topic created on first use.
const DefaultQueues = 4

// DefaultKeyMetadata is the metadata field whose value is a message's key
// (the name Watermill's Kafka examples use for a partition key).
const DefaultKeyMetadata = "partition_key"

// UUIDHeader is the Ferry header that carries a Watermill message's UUID.
// A metadata field of that name does not survive the trip.
const UUIDHeader = "_watermill_message_uuid"

// PublisherConfig configures a [Publisher]. Zero fields take their
// defaults.
type PublisherConfig struct {
	// Queues is the queue count of a topic Publish creates. Default
	// [DefaultQueues].
	Queues int
	// Retention bounds each queue of a topic Publish creates. Default:
	// Ferry's (see [ferry.Retention]).
	Retention ferry.Retention
	// KeyMetadata names the metadata field whose value becomes the
	// message's key. Default [DefaultKeyMetadata].
	KeyMetadata string
	// Key, if set, computes a message's key instead of KeyMetadata (as
	// watermill-kafka's GeneratePartitionKey does). An error fails the
	// Publish.
	Key func(topic string, msg *message.Message) (string, error)
	// ProducerOptions are passed to [ferry.Broker.NewProducer] (a router,
	// a producer name, a size limit).
	ProducerOptions []ferry.ProducerOption
}

// Publisher publishes Watermill messages to a Ferry broker. It is safe for
// concurrent use and starts no goroutine.
type Publisher struct {
	b      *ferry.Broker
	cfg    PublisherConfig
	p      *ferry.Producer
	topics topicCache
	ctx    context.Context // cancelled by Close: a blocked Publish returns
	cancel context.CancelFunc

	mu     sync.RWMutex // guards closed against Publish
	closed bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a publisher over b, which stays the caller's to
// close. A nil broker or a negative queue count is
// [ferry.ErrInvalidOption].
func NewPublisher(b *ferry.Broker, cfg PublisherConfig) (*Publisher, error) {
	if b == nil {
		return nil, fmt.Errorf("ferrywm: new publisher: %w: nil broker", ferry.ErrInvalidOption)
	}
	if cfg.Queues < 0 {
		return nil, fmt.Errorf("ferrywm: new publisher: %w: queues %d", ferry.ErrInvalidOption, cfg.Queues)
	}
	if cfg.Queues == 0 {
		cfg.Queues = DefaultQueues
	}
	if cfg.KeyMetadata == "" {
		cfg.KeyMetadata = DefaultKeyMetadata
	}
	p, err := b.NewProducer(cfg.ProducerOptions...)
	if err != nil {
		return nil, fmt.Errorf("ferrywm: new publisher: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Publisher{b: b, cfg: cfg, p: p, ctx: ctx, cancel: cancel}, nil
}

// Publish sends msgs to topic, in order, creating the topic on first use.
// It returns once every message is stored (all or nothing per queue, see
// [ferry.Producer.SendBatch]). After Close it returns an error wrapping
// [ferry.ErrClosed].
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return fmt.Errorf("ferrywm: publish to %q: %w", topic, ferry.ErrClosed)
	}
	if len(msgs) == 0 {
		return nil
	}
	out := make([]*ferry.Message, len(msgs))
	for i, msg := range msgs {
		if msg == nil {
			return fmt.Errorf("ferrywm: publish to %q: %w: nil message at %d", topic, ferry.ErrInvalidMessage, i)
		}
		m, err := p.marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("ferrywm: publish %s to %q: %w", msg.UUID, topic, err)
		}
		out[i] = m
	}
	if err := p.topics.ensure(p.ctx, p.b, ferry.TopicMeta{Name: topic, Queues: p.cfg.Queues, Retention: p.cfg.Retention}); err != nil {
		return fmt.Errorf("ferrywm: publish to %q: %w", topic, err)
	}
	if _, err := p.p.SendBatch(p.ctx, out); err != nil {
		return fmt.Errorf("ferrywm: publish to %q: %w", topic, err)
	}
	return nil
}

// marshal turns msg into a Ferry message: payload as body, metadata as
// headers, the UUID under UUIDHeader, the key from the metadata.
func (p *Publisher) marshal(topic string, msg *message.Message) (*ferry.Message, error) {
	var key string
	if p.cfg.Key != nil {
		k, err := p.cfg.Key(topic, msg)
		if err != nil {
			return nil, fmt.Errorf("%w: key: %w", ferry.ErrInvalidMessage, err)
		}
		key = k
	} else {
		key = msg.Metadata.Get(p.cfg.KeyMetadata)
	}
	h := make(map[string]string, len(msg.Metadata)+1)
	maps.Copy(h, msg.Metadata)
	h[UUIDHeader] = msg.UUID
	// The stored message keeps the body: copy it so that the caller may
	// reuse msg's payload, as Watermill allows.
	return &ferry.Message{Topic: topic, Key: key, Headers: h, Body: append([]byte(nil), msg.Payload...)}, nil
}

// Close stops the publisher: later Publishes fail and a Publish blocked on a
// full back-pressured topic returns. It is idempotent, returns nil and
// leaves the broker open.
func (p *Publisher) Close() error {
	p.cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.p.Close()
}

// topicCache remembers topics known to exist, so that a Publish or
// Subscribe to a known topic does not ask the broker.
type topicCache struct {
	known sync.Map // topic name -> struct{}
}

// ensure creates the topic meta names unless it exists; a topic that
// exists with other metadata is used as it is.
func (c *topicCache) ensure(ctx context.Context, b *ferry.Broker, meta ferry.TopicMeta) error {
	if _, ok := c.known.Load(meta.Name); ok {
		return nil
	}
	if _, ok := b.Topic(meta.Name); !ok {
		err := b.CreateTopic(ctx, meta)
		if err != nil && !errors.Is(err, ferry.ErrTopicExists) {
			return err
		}
	}
	c.known.Store(meta.Name, struct{}{})
	return nil
}
