package ferrywm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ferrymq/ferry"
	ferrywm "github.com/ferrymq/ferry/adapters/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// watchdog bounds a wait so that a hang fails instead of blocking the run.
const watchdog = 30 * time.Second

func newPubSub(t *testing.T, b *ferry.Broker, pcfg ferrywm.PublisherConfig, scfg ferrywm.SubscriberConfig) (*ferrywm.Publisher, *ferrywm.Subscriber) {
	t.Helper()
	pub, err := ferrywm.NewPublisher(b, pcfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	sub, err := ferrywm.NewSubscriber(b, scfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return pub, sub
}

func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(watchdog):
		t.Fatal("watchdog: no message")
		return nil
	}
}

func TestMessageRoundTrip(t *testing.T) {
	b := memoryBroker(t)
	pub, sub := newPubSub(t, b, ferrywm.PublisherConfig{Queues: 3}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	in := message.NewMessage(watermill.NewUUID(), []byte("hello"))
	in.Metadata.Set("a", "1")
	in.Metadata.Set(ferrywm.DefaultKeyMetadata, "customer-7")
	require.NoError(t, pub.Publish("rt", in))

	meta, ok := b.Topic("rt")
	require.True(t, ok, "the topic is created on first use")
	assert.Equal(t, 3, meta.Queues)
	stored := findStored(t, b, "rt")
	assert.Equal(t, "customer-7", stored.Key, "the key comes from the key metadata")
	assert.Equal(t, in.UUID, stored.Headers[ferrywm.UUIDHeader])
	assert.Equal(t, "1", stored.Headers["a"])

	ch, err := sub.Subscribe(context.Background(), "rt")
	require.NoError(t, err)
	out := receive(t, ch)
	assert.Equal(t, in.UUID, out.UUID)
	assert.Equal(t, in.Payload, out.Payload)
	assert.Equal(t, in.Metadata, out.Metadata, "the UUID header does not leak into the metadata")
	require.True(t, out.Ack())
	select {
	case <-out.Context().Done():
	case <-time.After(watchdog):
		t.Fatal("watchdog: the message context outlives its Ack")
	}
}

// findStored returns the one message of a topic, reading its queues.
func findStored(t *testing.T, b *ferry.Broker, topic string) *ferry.EnhancedMessage {
	t.Helper()
	meta, _ := b.Topic(topic)
	for i := range meta.Queues {
		q, err := b.Queue(topic, i)
		require.NoError(t, err)
		if _, next := q.Offsets(); next > 0 {
			dst := make([]*ferry.EnhancedMessage, 1)
			n, err := q.Read(context.Background(), 0, dst)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			return dst[0]
		}
	}
	t.Fatal("no stored message")
	return nil
}

// Messages of one key keep their order across a group of subscribers,
// while unkeyed messages spread over every queue (in runs of
// ferry.DefaultStickyRun when they come fast).
func TestKeyOrderAcrossSubscribersOfAGroup(t *testing.T) {
	const keys, perKey = 8, 50
	const unkeyed = ferry.DefaultStickyRun * ferrywm.DefaultQueues
	b := memoryBroker(t)
	pub, sub1 := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	_, sub2 := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	for i := range perKey {
		for k := range keys {
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%d", i))
			msg.Metadata.Set(ferrywm.DefaultKeyMetadata, fmt.Sprint("k", k))
			require.NoError(t, pub.Publish("ordered", msg))
		}
	}
	for range unkeyed {
		require.NoError(t, pub.Publish("ordered", message.NewMessage(watermill.NewUUID(), []byte("unkeyed"))))
	}
	for i := range ferrywm.DefaultQueues {
		q, err := b.Queue("ordered", i)
		require.NoError(t, err)
		_, next := q.Offsets()
		assert.Positive(t, next, "queue %d got no message", i)
	}

	var mu sync.Mutex
	seen := map[string]bool{}
	last := map[string]int{}
	var bad []string
	all := make(chan struct{})
	consume := func(ch <-chan *message.Message) {
		for msg := range ch {
			mu.Lock()
			if key := msg.Metadata.Get(ferrywm.DefaultKeyMetadata); key != "" && !seen[msg.UUID] {
				var i int
				fmt.Sscan(string(msg.Payload), &i)
				if prev, ok := last[key]; ok && i != prev+1 || !ok && i != 0 {
					bad = append(bad, fmt.Sprintf("%s: %d after %d", key, i, prev))
				}
				last[key] = i
			}
			seen[msg.UUID] = true
			if len(seen) == keys*perKey+unkeyed {
				close(all)
			}
			mu.Unlock()
			msg.Ack()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch1, err := sub1.Subscribe(ctx, "ordered")
	require.NoError(t, err)
	ch2, err := sub2.Subscribe(ctx, "ordered")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { consume(ch1) })
	wg.Go(func() { consume(ch2) })
	select {
	case <-all:
	case <-time.After(watchdog):
		t.Fatal("watchdog: not every message arrived")
	}
	cancel() // ends both subscriptions: their channels close
	wg.Wait()
	assert.Empty(t, bad)
}

func TestCloseIsIdempotentAndLeavesTheBroker(t *testing.T) {
	b := memoryBroker(t)
	pub, err := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{})
	require.NoError(t, err)
	sub, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), []byte("x"))))
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	held := receive(t, ch) // unacked when Close comes
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	require.NoError(t, pub.Close())
	require.NoError(t, pub.Close())
	_, open := <-ch
	assert.False(t, open, "Close closes the channel")
	select {
	case <-held.Context().Done():
	default:
		t.Error("Close cancels the context of a message in flight")
	}
	require.ErrorIs(t, pub.Publish("t", message.NewMessage(watermill.NewUUID(), nil)), ferry.ErrClosed)
	_, err = sub.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, ferry.ErrClosed)

	// The broker lives on, and the unacked message goes to the group again:
	// through its retry topic, counted as an attempt, when its handler
	// returned before Close revoked the queue, else from its queue.
	_, again := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	ch, err = again.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	msg := receive(t, ch)
	assert.Equal(t, held.UUID, msg.UUID)
	assert.Equal(t, held.Metadata, msg.Metadata)
	assert.Contains(t, []int{1, 2}, attempt(t, msg))
	msg.Ack()
}

func TestBadInput(t *testing.T) {
	b := memoryBroker(t)
	_, err := ferrywm.NewPublisher(nil, ferrywm.PublisherConfig{})
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = ferrywm.NewPublisher(b, ferrywm.PublisherConfig{Queues: -1})
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = ferrywm.NewSubscriber(nil, ferrywm.SubscriberConfig{})
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	for name, cfg := range map[string]ferrywm.SubscriberConfig{
		"queues":   {Queues: -1},
		"attempts": {MaxAttempts: -1},
		"backoff":  {RetryBackoff: -time.Second},
		"drain":    {DrainTimeout: -time.Second},
		"group":    {ConsumerGroup: string(make([]byte, 300))},
		"options":  {ConsumerOptions: []ferry.ConsumerOption{ferry.WithBuffer(0, 0)}},
	} {
		_, err := ferrywm.NewSubscriber(b, cfg)
		require.ErrorIs(t, err, ferry.ErrInvalidOption, name)
	}

	pub, sub := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	require.ErrorIs(t, pub.Publish("bad topic", message.NewMessage(watermill.NewUUID(), nil)), ferry.ErrInvalidTopic)
	require.ErrorIs(t, pub.Publish("t", nil), ferry.ErrInvalidMessage)
	_, err = sub.Subscribe(context.Background(), "bad/topic")
	require.ErrorIs(t, err, ferry.ErrInvalidTopic)
	_, err = sub.Subscribe(nil, "t") //lint:ignore SA1012 a nil context is the input under test
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, ok := ferrywm.DeliveryFrom(nil) //lint:ignore SA1012 a nil context is the input under test
	assert.False(t, ok)
	assert.Empty(t, b.Topics(), "bad input creates nothing")
}

// A message acked just before its subscription ends is finished, never
// delivered again: the end of the subscription must not win a race
// against the Ack.
func TestAckRightBeforeCloseIsKept(t *testing.T) {
	b := memoryBroker(t)
	pub, err := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{Queues: 1})
	require.NoError(t, err)
	defer pub.Close()
	for i := range 100 {
		acked := message.NewMessage(watermill.NewUUID(), []byte("acked"))
		next := message.NewMessage(watermill.NewUUID(), []byte("next"))
		require.NoError(t, pub.Publish("t", acked, next))
		sub, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
		require.NoError(t, err)
		ch, err := sub.Subscribe(context.Background(), "t")
		require.NoError(t, err)
		msg := receive(t, ch)
		require.Equal(t, acked.UUID, msg.UUID, "round %d", i)
		msg.Ack()
		require.NoError(t, sub.Close())

		sub, err = ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
		require.NoError(t, err)
		ch, err = sub.Subscribe(context.Background(), "t")
		require.NoError(t, err)
		msg = receive(t, ch)
		require.Equal(t, next.UUID, msg.UUID, "round %d: the acked message came again", i)
		msg.Ack()
		require.NoError(t, sub.Close())
	}
}

// A subscription without a consumer group has a group of its own, which
// nobody comes back to: when it ends, it must not keep a topic with Block
// overflow blocked.
func TestEndedSubscriptionWithoutGroupReleasesBlockTopic(t *testing.T) {
	ctx := context.Background()
	b := memoryBroker(t)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 1,
		Retention: ferry.Retention{MaxMessages: 2, Overflow: ferry.Block}}))
	pub, own := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{})
	require.NoError(t, pub.Publish("jobs", message.NewMessage(watermill.NewUUID(), []byte("0"))))

	octx, cancel := context.WithCancel(ctx)
	och, err := own.Subscribe(octx, "jobs")
	require.NoError(t, err)
	receive(t, och) // the group of its own now reads the topic; never acked
	cancel()
	for range och { // closed once the subscription has ended
	}

	_, grouped := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{ConsumerGroup: "live"})
	ch, err := grouped.Subscribe(ctx, "jobs")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("jobs", message.NewMessage(watermill.NewUUID(), []byte("1"))))
	// "0" counted as an attempt of the ended subscription and went to its
	// group's retry topic: it is finished in "jobs" and may be dropped
	// before "live" joins.
	for msg := receive(t, ch); ; msg = receive(t, ch) {
		msg.Ack()
		if string(msg.Payload) == "1" {
			break
		}
	}
	p, err := b.NewProducer()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := p.TrySend(&ferry.Message{Topic: "jobs"})
		return err == nil
	}, watchdog, time.Millisecond, "the ended subscription's group no longer holds the topic")
}
