package ferrywm_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/ferrymq/ferry"
	ferrywm "github.com/ferrymq/ferry/adapters/watermill"
	"github.com/ferrymq/ferry/filestore"
	"github.com/stretchr/testify/require"
)

// features are what Ferry offers Watermill: consumer groups, messages kept
// in the broker whoever subscribes (Persistent), and at most one unacked
// message per subscription with per-key order (GuaranteedOrder: the
// scenarios it enables check order without Nacks and that no message comes
// before the previous one's Ack, both true; a nacked message comes back
// after the ones that followed it, which no scenario checks). Delivery
// is at least once, hence no ExactlyOnceDelivery. TestReconnect stays
// skipped: it restarts an external broker with a shell command, and Ferry
// runs in the test's process.
var features = tests.Features{
	ConsumerGroups:      true,
	ExactlyOnceDelivery: false,
	GuaranteedOrder:     true,
	Persistent:          true,
}

func TestUniversalMemory(t *testing.T) {
	t.Parallel()
	runUniversal(t, memoryBroker(t), nil)
}

func TestUniversalFilestore(t *testing.T) {
	t.Parallel()
	runUniversal(t, fileBroker(t), nil)
}

// memoryBroker returns a broker over the memory store, closed when t and
// all its (parallel) subtests are done.
func memoryBroker(t *testing.T) *ferry.Broker {
	t.Helper()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// fileBroker returns a broker over a filestore in a temporary directory.
func fileBroker(t *testing.T) *ferry.Broker {
	t.Helper()
	st, err := filestore.Open(t.TempDir(), filestore.WithSync(filestore.SyncNever))
	require.NoError(t, err)
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, b.Close())
		require.NoError(t, st.Close())
	})
	return b
}

// payloadKey keys a message by its payload. The in-order scenario checks
// order per payload ("0" to "15", the message type), as Watermill's Kafka
// harness did by keying its partitions on that type; the other scenarios'
// payloads spread over the queues or share one.
func payloadKey(_ string, msg *message.Message) (string, error) { return string(msg.Payload), nil }

func constructors(b *ferry.Broker, opts []ferry.ConsumerOption) (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	group := func(t *testing.T, g string) (message.Publisher, message.Subscriber) {
		pub, err := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{Key: payloadKey})
		require.NoError(t, err)
		sub, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: g, ConsumerOptions: opts})
		require.NoError(t, err)
		closeLater(t, sub)
		return pub, sub
	}
	return func(t *testing.T) (message.Publisher, message.Subscriber) { return group(t, "default") }, group
}

// closeLater closes sub when the scenario ends. The suite closes what it
// creates, except the subscribers of the in-order scenario's multiplier:
// `defer require.NoError(t, sub.Close())` closes it before it subscribes.
func closeLater(t *testing.T, sub message.Subscriber) {
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
}

// runUniversal runs the suite over b, the subscribers made with opts.
func runUniversal(t *testing.T, b *ferry.Broker, opts []ferry.ConsumerOption) {
	ctor, groupCtor := constructors(b, opts)
	tests.TestPubSub(t, features, ctor, groupCtor)

	// A subscriber without a consumer group reads the whole topic: every
	// new one receives the old messages, as Kafka's group-less one does.
	t.Run("TestNewSubscriberReceivesOldMessages/WithoutConsumerGroup", func(t *testing.T) {
		t.Parallel()
		f := features
		f.NewSubscriberReceivesOldMessages = true
		tests.TestNewSubscriberReceivesOldMessages(t, tests.TestContext{TestID: tests.NewTestID(), Features: f},
			func(t *testing.T) (message.Publisher, message.Subscriber) {
				pub, err := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{})
				require.NoError(t, err)
				sub, err := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerOptions: opts})
				require.NoError(t, err)
				closeLater(t, sub)
				return pub, sub
			})
	})
}
