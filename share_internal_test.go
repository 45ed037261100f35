package ferry

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A worker that keeps a fast handler's pending messages for itself (it
// lists its queue again without waking another worker) does not strand
// them when the handler then stalls: after shareGuard another worker is
// called. Here the stalled call waits for a message beyond what one
// worker takes alone, and the handler's cost is set so small that the
// worker keeps the rest.
func TestConsumerStalledHandlerDoesNotStrandPendingMessages(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	const stall = 4 * maxAlone
	unblock := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]bool{}
	all := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		switch string(m.Body) {
		case "0":
			select { // stalls until the last message is handled
			case <-unblock:
			case <-ctx.Done():
				return ctx.Err()
			}
		case strconv.Itoa(stall - 1):
			close(unblock)
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[string(m.Body)] = true; len(seen) == stall {
			close(all)
		}
		return nil
	})
	c, err := b.NewConsumer("g", "t", h, WithConcurrency(4))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	c.d.Load().cost.Store(1) // a nanosecond a message: a worker keeps what it can
	p, err := b.NewProducer()
	require.NoError(t, err)
	msgs := make([]*Message, stall)
	for i := range msgs {
		msgs[i] = &Message{Topic: "t", Body: []byte(strconv.Itoa(i))}
	}
	_, err = p.SendBatch(ctx, msgs) // one write: fetched and put at once
	require.NoError(t, err)
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		t.Fatal("watchdog: pending messages stranded behind a stalled handler")
	}
}

func TestFifoKeepsOrderAndCapacity(t *testing.T) {
	var q fifo[int]
	next, want := 0, 0
	for round := range 50 {
		for range round%7 + 1 {
			q.push(next % 100)
			next++
		}
		for range round%5 + 1 {
			if q.len() == 0 {
				break
			}
			require.Equal(t, want%100, q.pop())
			want++
		}
	}
	for q.len() > 0 {
		require.Equal(t, want%100, q.pop())
		want++
	}
	require.Equal(t, next, want)
	require.LessOrEqual(t, cap(q.items), 128, "cycling must not grow the slice without bound")
	allocs := testing.AllocsPerRun(100, func() {
		q.push(0)
		q.pop()
	})
	require.Zero(t, allocs)
	// The runner pool's queue holds tasks, interfaces over pointers:
	// queueing one allocates nothing either.
	var tasks fifo[task]
	run := &queueRun{}
	allocs = testing.AllocsPerRun(100, func() {
		tasks.push(run)
		tasks.pop()
	})
	require.Zero(t, allocs)
}

// gatedCursors is a memory cursor store whose commits past offset 0 wait
// until gate is closed: a store stuck on a slow disk.
type gatedCursors struct {
	*MemoryCursorStore
	gate    chan struct{}
	entered chan struct{} // closed when a commit first waits
	once    sync.Once
}

func (g *gatedCursors) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if offset > 0 { // the start offset a take commits goes through
		g.once.Do(func() { close(g.entered) })
		<-g.gate
	}
	return g.MemoryCursorStore.Commit(ctx, topic, group, queue, offset)
}

func (g *gatedCursors) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if offset > 0 {
		g.once.Do(func() { close(g.entered) })
		<-g.gate
	}
	return g.MemoryCursorStore.CommitFenced(ctx, topic, group, queue, offset, token)
}

// A slow cursor store does not hold up the handler: commits go to the
// committer goroutine until they prove fast. Here a commit never returns
// until the end, and one worker must still handle every message.
func TestConsumerSlowCursorStoreDoesNotHoldHandlers(t *testing.T) {
	ctx := context.Background()
	store := &gatedCursors{MemoryCursorStore: NewMemoryCursorStore(), gate: make(chan struct{}), entered: make(chan struct{})}
	defer store.Close()
	b, err := NewBroker(WithCursorStore(store))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	const n = 200
	var handled atomic.Int64
	all := make(chan struct{})
	c, err := b.NewConsumer("g", "t", HandlerFunc(func(context.Context, *EnhancedMessage) error {
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	}), WithConcurrency(1), WithStartFrom(Latest))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	for i := range n {
		_, err := p.Send(ctx, &Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
		if i == 0 {
			<-store.entered // a commit is stuck from here on
		}
	}
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		t.Fatalf("watchdog: %d of %d handled while a commit was stuck", handled.Load(), n)
	}
	close(store.gate)
	require.NoError(t, c.Close())
	offs, err := store.Load(ctx, "t", "g", 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{n}, offs, "the final commit has everything")
}

// With a fast cursor store, commits move into the workers: the measured
// commit cost falls under inlineCommitMax, and cursors still advance.
func TestConsumerFastCursorStoreCommitsInPlace(t *testing.T) {
	ctx := context.Background()
	cursors := NewMemoryCursorStore()
	t.Cleanup(func() { _ = cursors.Close() }) // after the consumers: their last commits go in
	b, err := NewBroker(WithCursorStore(cursors))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	var handled atomic.Int64
	c, err := b.NewConsumer("g", "t", HandlerFunc(func(context.Context, *EnhancedMessage) error {
		handled.Add(1)
		return nil
	}), WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	sent := int64(0)
	deadline := time.Now().Add(60 * time.Second)
	for c.m.b.groups.commitCost.Load() > int64(inlineCommitMax) {
		require.True(t, time.Now().Before(deadline), "watchdog: commits never measured fast")
		_, err := p.Send(ctx, &Message{Topic: "t"})
		require.NoError(t, err)
		sent++
		for handled.Load() < sent { // one at a time: a commit each
			runtime.Gosched()
		}
	}
	_, err = p.Send(ctx, &Message{Topic: "t"})
	require.NoError(t, err)
	sent++
	require.Eventually(t, func() bool {
		offs, err := cursors.Load(ctx, "t", "g", 1)
		return err == nil && offs[0] == sent
	}, 60*time.Second, time.Millisecond, "the cursor follows the handled messages")
}
