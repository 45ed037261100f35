package ferry

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

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
	c.d.cost.Store(1) // a nanosecond a message: a worker keeps what it can
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
	vals := make([]int, 100)
	for i := range vals {
		vals[i] = i
	}
	next, want := 0, 0
	for round := range 50 {
		for range round%7 + 1 {
			q.push(&vals[next%100])
			next++
		}
		for range round%5 + 1 {
			if q.len() == 0 {
				break
			}
			require.Equal(t, want%100, *q.pop())
			want++
		}
	}
	for q.len() > 0 {
		require.Equal(t, want%100, *q.pop())
		want++
	}
	require.Equal(t, next, want)
	require.LessOrEqual(t, cap(q.items), 128, "cycling must not grow the slice without bound")
	allocs := testing.AllocsPerRun(100, func() {
		q.push(&vals[0])
		q.pop()
	})
	require.Zero(t, allocs)
}
