package ferry_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// An idle consumer on the memory storage parks no goroutine: neither its
// membership loop nor its fetch loop nor a worker. Thousands of topics
// with a consumer each must cost memory, not goroutines.
func TestIdleConsumersParkNoGoroutine(t *testing.T) {
	const topics = 200
	b, p := newBrokerAndProducer(t)
	before := runtime.NumGoroutine()

	var handled atomic.Int64
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		handled.Add(1)
		return nil
	})
	startPerTopic(t, b, topics, h)
	// What Start left behind winds down at once: nothing waits on a timer.
	assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+topics/20 },
		5*time.Second, 5*time.Millisecond, "goroutines after starting %d idle consumers: %d, before: %d", topics, runtime.NumGoroutine(), before)

	sendPerTopic(t, p, topics)
	require.Eventually(t, func() bool { return handled.Load() == topics }, 10*time.Second, time.Millisecond)
	// The workers and committers the messages started retire once idle.
	assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+topics/20 },
		10*time.Second, 10*time.Millisecond, "goroutines after the consumers went idle again: %d, before: %d", runtime.NumGoroutine(), before)
}

// Handlers that wait for one another across many topics all get to run:
// the fetch loops that a write wakes share a bounded pool of runners,
// which must not leave a woken queue waiting behind handlers that block.
func TestBlockedHandlersDoNotStarveOtherTopics(t *testing.T) {
	const topics = 100 // many more than the runners the pool starts at once
	b, p := newBrokerAndProducer(t)

	var started atomic.Int64
	all := make(chan struct{})
	h := ferry.HandlerFunc(func(ctx context.Context, _ *ferry.EnhancedMessage) error {
		if started.Add(1) == topics {
			close(all)
		}
		select { // a barrier: every topic's handler must start
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	startPerTopic(t, b, topics, h)
	sendPerTopic(t, p, topics)
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d handlers started", started.Load(), topics)
	}
}

// A burst over many idle topics, a few messages each, starts no worker
// goroutine per consumer: the goroutines that fetch handle what they
// fetched, and a consumer whose handler cost is not yet measured calls
// another worker only if the handler runs long.
func TestBurstOverIdleTopicsStartsNoWorkerPerConsumer(t *testing.T) {
	const topics, each = 200, 4
	ctx := context.Background()
	b, p := newBrokerAndProducer(t)
	var handled atomic.Int64
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		handled.Add(1)
		return nil
	})
	startPerTopic(t, b, topics, h)
	before := runtime.NumGoroutine()
	msgs := make([]*ferry.Message, each)
	for i := range topics {
		for k := range msgs {
			msgs[k] = &ferry.Message{Topic: fmt.Sprintf("t%d", i), Body: []byte("x")}
		}
		_, err := p.SendBatch(ctx, msgs) // several pending at once: the case a worker would be called for
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return handled.Load() == topics*each }, 10*time.Second, time.Millisecond)
	// Workers retire after a second idle: any started now are still here.
	assert.Less(t, runtime.NumGoroutine()-before, topics/4, "goroutines left by the burst")
}

// newBrokerAndProducer returns a memory broker and a producer of it, both
// closed when the test ends (after the consumers startPerTopic starts).
func newBrokerAndProducer(t *testing.T) (*ferry.Broker, *ferry.Producer) {
	t.Helper()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	p, err := b.NewProducer()
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return b, p
}

// startPerTopic creates topics t0, t1, … of one queue, each with a
// started consumer of group g calling h.
func startPerTopic(t *testing.T, b *ferry.Broker, topics int, h ferry.Handler) {
	t.Helper()
	ctx := context.Background()
	for i := range topics {
		name := fmt.Sprintf("t%d", i)
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: name, Queues: 1}))
		c, err := b.NewConsumer("g", name, h)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.Start(ctx))
	}
}

// sendPerTopic sends one message to each of topics t0, t1, ….
func sendPerTopic(t *testing.T, p *ferry.Producer, topics int) {
	t.Helper()
	for i := range topics {
		_, err := p.Send(context.Background(), &ferry.Message{Topic: fmt.Sprintf("t%d", i), Body: []byte("x")})
		require.NoError(t, err)
	}
}
