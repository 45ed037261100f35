package ferrywm_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ferrymq/ferry"
	ferrywm "github.com/ferrymq/ferry/adapters/watermill"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// grace is how long a test watches for a message that must not come. It
// bounds no wait for state: a message that came later would be a bug the
// test misses, never a false failure.
const grace = 100 * time.Millisecond

// clockBroker returns a memory broker whose delays and retries run on a
// fake clock, which only the test moves.
func clockBroker(t *testing.T) (*ferry.Broker, *ferrytest.FakeClock) {
	t.Helper()
	fc := ferrytest.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b, err := ferry.NewBroker(ferry.WithClock(fc))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b, fc
}

// autoAdvance moves fc to its next timer whenever one is pending, until
// the test ends: every backoff passes at once.
func autoAdvance(t *testing.T, fc *ferrytest.FakeClock) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for fc.WaitForTimers(ctx, 1) == nil {
			fc.AdvanceToNext()
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// advance moves fc by d once a timer is pending: a Nack returns before
// the retry is written and its timer set, and a timer set after the move
// would count from the new time.
func advance(t *testing.T, fc *ferrytest.FakeClock, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	require.NoError(t, fc.WaitForTimers(ctx, 1), "watchdog: no timer")
	fc.Advance(d)
}

func assertNone(t *testing.T, ch <-chan *message.Message, why string) {
	t.Helper()
	select {
	case msg := <-ch:
		t.Fatalf("%s: got %s (%s)", why, msg.UUID, msg.Payload)
	case <-time.After(grace):
	}
}

func attempt(t *testing.T, msg *message.Message) int {
	t.Helper()
	d, ok := ferrywm.DeliveryFrom(msg.Context())
	require.True(t, ok, "the message context carries its delivery")
	return d.Attempt
}

func newMessage(payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata.Set("kind", payload)
	return msg
}

// A nacked message comes back, as it was published, once its backoff has
// passed on the broker's clock and not before; the messages after it in
// its queue are delivered meanwhile.
func TestNackComesBackAfterTheBackoffWhileTheQueueFlows(t *testing.T) {
	const backoff = time.Minute
	b, fc := clockBroker(t)
	pub, sub := newPubSub(t, b, ferrywm.PublisherConfig{Queues: 1},
		ferrywm.SubscriberConfig{ConsumerGroup: "g", RetryBackoff: backoff})
	nacked, after1, after2 := newMessage("nacked"), newMessage("after-1"), newMessage("after-2")
	require.NoError(t, pub.Publish("work", nacked, after1, after2))
	ch, err := sub.Subscribe(context.Background(), "work")
	require.NoError(t, err)

	msg := receive(t, ch)
	require.Equal(t, nacked.UUID, msg.UUID)
	assert.Equal(t, 1, attempt(t, msg))
	t0 := fc.Now()
	require.True(t, msg.Nack())
	for _, want := range []*message.Message{after1, after2} {
		msg := receive(t, ch)
		require.Equal(t, want.UUID, msg.UUID, "the queue flows past the nacked message")
		require.True(t, msg.Ack())
	}

	advance(t, fc, backoff-time.Second)
	assertNone(t, ch, "before its backoff")
	fc.Advance(time.Second)
	again := receive(t, ch)
	assert.False(t, fc.Now().Before(t0.Add(backoff)))
	assert.Equal(t, nacked.UUID, again.UUID)
	assert.Equal(t, nacked.Payload, again.Payload)
	assert.Equal(t, nacked.Metadata, again.Metadata, "Ferry's retry headers do not leak into the metadata")
	assert.Equal(t, 2, attempt(t, again))
	require.True(t, again.Ack())
	assertNone(t, ch, "after its Ack")
}

// A nacked message that falls due while another is out waits for that
// one's Ack: a subscription has at most one unacked message, though the
// consumer reads its topic and the retry topic with two members.
func TestRetryWaitsForTheMessageOut(t *testing.T) {
	b, fc := clockBroker(t)
	pub, sub := newPubSub(t, b, ferrywm.PublisherConfig{Queues: 1}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	nacked, held := newMessage("nacked"), newMessage("held")
	require.NoError(t, pub.Publish("work", nacked, held))
	ch, err := sub.Subscribe(context.Background(), "work")
	require.NoError(t, err)

	require.True(t, receive(t, ch).Nack())
	out := receive(t, ch)
	require.Equal(t, held.UUID, out.UUID)
	advance(t, fc, time.Hour) // the retry is due
	assertNone(t, ch, "while a message is out")
	require.True(t, out.Ack())
	again := receive(t, ch)
	assert.Equal(t, nacked.UUID, again.UUID)
	again.Ack()
}

// Nacked MaxAttempts times, a message goes to the dead-letter topic with
// its UUID, metadata and attempt count.
func TestNackRetriesThenDeadLetters(t *testing.T) {
	b, fc := clockBroker(t)
	autoAdvance(t, fc)
	pub, sub := newPubSub(t, b, ferrywm.PublisherConfig{},
		ferrywm.SubscriberConfig{ConsumerGroup: "g", MaxAttempts: 3, ConsumerOptions: []ferry.ConsumerOption{ferry.WithDeadLetter("failed")}})
	in := newMessage("poison")
	require.NoError(t, pub.Publish("work", in))
	ch, err := sub.Subscribe(context.Background(), "work")
	require.NoError(t, err)
	for i := range 3 {
		msg := receive(t, ch)
		require.Equal(t, in.UUID, msg.UUID)
		require.Equal(t, in.Metadata, msg.Metadata)
		require.Equal(t, i+1, attempt(t, msg))
		require.True(t, msg.Nack())
	}

	dlq, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "ops"})
	require.NoError(t, err)
	defer dlq.Close()
	dch, err := dlq.Subscribe(context.Background(), "failed")
	require.NoError(t, err)
	dead := receive(t, dch)
	assert.Equal(t, in.UUID, dead.UUID)
	assert.Equal(t, "poison", dead.Metadata.Get("kind"))
	assert.Equal(t, "3", dead.Metadata.Get(ferry.HeaderAttempts))
	assert.Equal(t, "work", dead.Metadata.Get(ferry.HeaderOriginTopic))
	dead.Ack()
	assertNone(t, ch, "after the dead letter")
}

// The attempt count of a nacked message goes on in the next subscriber of
// the group (it travels in the retry topic), with unlimited attempts too.
func TestNackedMessageKeepsItsAttemptsAcrossSubscribers(t *testing.T) {
	b, fc := clockBroker(t)
	pub, err := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{})
	require.NoError(t, err)
	defer pub.Close()
	in := newMessage("flaky")
	require.NoError(t, pub.Publish("work", in))

	first, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	require.NoError(t, err)
	ch, err := first.Subscribe(context.Background(), "work")
	require.NoError(t, err)
	msg := receive(t, ch)
	require.Equal(t, 1, attempt(t, msg))
	msg.Nack()
	advance(t, fc, time.Hour)
	msg = receive(t, ch)
	require.Equal(t, 2, attempt(t, msg))
	msg.Nack() // due in 20 ms on the fake clock: it waits there
	require.NoError(t, first.Close())

	_, next := newPubSub(t, b, ferrywm.PublisherConfig{}, ferrywm.SubscriberConfig{ConsumerGroup: "g"})
	ch, err = next.Subscribe(context.Background(), "work")
	require.NoError(t, err)
	advance(t, fc, time.Hour)
	again := receive(t, ch)
	assert.Equal(t, in.UUID, again.UUID)
	assert.Equal(t, in.Metadata, again.Metadata)
	assert.Equal(t, 3, attempt(t, again))
	d, _ := ferrywm.DeliveryFrom(again.Context())
	assert.Equal(t, "g", d.Group)
	again.Ack()
}

// With ferry.Ordered in ConsumerOptions a nacked message is retried in
// its queue: it comes again before the message after it.
func TestOrderedNackHoldsTheQueue(t *testing.T) {
	b := memoryBroker(t)
	pub, sub := newPubSub(t, b, ferrywm.PublisherConfig{Queues: 1},
		ferrywm.SubscriberConfig{ConsumerGroup: "g", ConsumerOptions: []ferry.ConsumerOption{ferry.Ordered()}})
	first, second := newMessage("first"), newMessage("second")
	require.NoError(t, pub.Publish("work", first, second))
	ch, err := sub.Subscribe(context.Background(), "work")
	require.NoError(t, err)
	require.True(t, receive(t, ch).Nack())
	again := receive(t, ch)
	assert.Equal(t, first.UUID, again.UUID)
	assert.Equal(t, first.Metadata, again.Metadata)
	assert.Equal(t, 2, attempt(t, again))
	again.Ack()
	assert.Equal(t, second.UUID, receive(t, ch).UUID)
	retry, err := ferry.RetryTopic("g", "work")
	require.NoError(t, err)
	_, exists := b.Topic(retry)
	assert.False(t, exists, "no retry topic in ordered mode")
}
