package natsstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// node is one broker over its own connection, store and coordinator, as a
// process of its own would have.
type node struct {
	js    jetstream.JetStream
	store *natsstore.Store
	coord *natsstore.Coordinator
	b     *ferry.Broker
}

func newNode(t *testing.T, c *cluster, prefix string) *node {
	t.Helper()
	n := &node{js: c.connect(t)}
	var err error
	n.store, err = natsstore.Open(t.Context(), n.js, natsstore.WithPrefix(prefix), natsstore.WithOpTimeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.store.Close() })
	n.coord, err = natsstore.NewCoordinator(t.Context(), n.js, natsstore.WithPrefix(prefix), natsstore.WithTTL(childTTL), natsstore.WithOpTimeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.coord.Close() })
	n.b, err = ferry.NewBroker(ferry.WithStorage(n.store), ferry.WithCursorStore(n.store), ferry.WithCoordinator(n.coord))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.b.Close() })
	return n
}

// tally records who handled what.
type tally struct {
	mu   sync.Mutex
	seen map[string][]string // body -> members
	cond chan struct{}       // signalled on every handling
}

func newTally() *tally { return &tally{seen: map[string][]string{}, cond: make(chan struct{}, 1)} }

func (tl *tally) handler() ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		tl.mu.Lock()
		tl.seen[string(m.Body)] = append(tl.seen[string(m.Body)], d.Member)
		tl.mu.Unlock()
		select {
		case tl.cond <- struct{}{}:
		default:
		}
		return nil
	})
}

// await waits until every body was handled.
func (tl *tally) await(t *testing.T, ctx context.Context, bodies []string) {
	t.Helper()
	for {
		tl.mu.Lock()
		missing := 0
		for _, b := range bodies {
			if len(tl.seen[b]) == 0 {
				missing++
			}
		}
		tl.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-tl.cond:
		case <-ctx.Done():
			t.Fatalf("%d of %d messages never handled", missing, len(bodies))
		}
	}
}

func send(t *testing.T, ctx context.Context, p *ferry.Producer, phase string, n int) []string {
	t.Helper()
	var bodies []string
	for i := range n {
		b := fmt.Sprintf("%s-%d", phase, i)
		_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: b, Body: []byte(b)})
		require.NoError(t, err)
		bodies = append(bodies, b)
	}
	return bodies
}

// waitAssigned waits until the consumers' assignments are the sizes want.
func waitAssigned(t *testing.T, ctx context.Context, want []int, cs ...*ferry.Consumer) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		for i, c := range cs {
			ok = ok && len(c.Assigned()) == want[i]
		}
		if ok {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			got := make([]int, len(cs))
			for i, c := range cs {
				got[i] = len(c.Assigned())
			}
			t.Fatalf("assignments %v, want %v", got, want)
		}
	}
}

// TestConsumerTwoBrokers runs one group over two brokers, each with its
// own connection, store and coordinator on one server: they split the
// queues; when one leaves, the other takes them all; when one's
// connection dies without leaving (a crash, as far as NATS can tell), the
// other takes its queues once the TTL ran out. Nothing is lost.
func TestConsumerTwoBrokers(t *testing.T) {
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("e%d", fresh.Add(1))
	n1, n2 := newNode(t, c, prefix), newNode(t, c, prefix)
	meta := ferry.TopicMeta{Name: "orders", Queues: 4}
	require.NoError(t, n1.b.CreateTopic(ctx, meta))
	require.NoError(t, n2.b.CreateTopic(ctx, meta))
	tl := newTally()
	c1, err := n1.b.NewConsumer("billing", "orders", tl.handler(), ferry.WithMemberID("m1"))
	require.NoError(t, err)
	defer c1.Close()
	require.NoError(t, c1.Start(ctx))
	c2, err := n2.b.NewConsumer("billing", "orders", tl.handler(), ferry.WithMemberID("m2"))
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, c2.Start(ctx))
	waitAssigned(t, ctx, []int{2, 2}, c1, c2)

	p, err := n1.b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	all := send(t, ctx, p, "split", 200)
	tl.await(t, ctx, all)
	tl.mu.Lock()
	by := map[string]int{}
	for _, b := range all {
		by[tl.seen[b][0]]++
	}
	tl.mu.Unlock()
	require.Positive(t, by["m1"])
	require.Positive(t, by["m2"])

	// m2 leaves: m1 takes every queue.
	require.NoError(t, c2.Close())
	waitAssigned(t, ctx, []int{4}, c1)
	more := send(t, ctx, p, "left", 100)
	tl.await(t, ctx, more)
	all = append(all, more...)

	// m3 joins over a new node, then its connection dies without a word.
	n3 := newNode(t, c, prefix)
	c3, err := n3.b.NewConsumer("billing", "orders", tl.handler(), ferry.WithMemberID("m3"))
	require.NoError(t, err)
	defer c3.Close()
	require.NoError(t, c3.Start(ctx))
	waitAssigned(t, ctx, []int{2, 2}, c1, c3)
	n3.js.Conn().Close()
	died := time.Now()
	waitAssigned(t, ctx, []int{4}, c1)
	t.Logf("m1 holds every queue %v after m3's connection died (TTL 2s)", time.Since(died).Round(10*time.Millisecond))
	more = send(t, ctx, p, "crashed", 100)
	tl.await(t, ctx, more)
	all = append(all, more...)

	tl.mu.Lock()
	defer tl.mu.Unlock()
	dups := 0
	for _, b := range all {
		require.NotEmpty(t, tl.seen[b], "%s never handled", b)
		dups += len(tl.seen[b]) - 1
	}
	t.Logf("%d messages, all handled, %d more than once", len(all), dups)
}
