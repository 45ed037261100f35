package ferry

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A revoke stops a taken batch: one queue of 200 messages, one worker,
// the handler blocked on the first message when the queue is revoked
// (by Close, or by a rebalance giving it to a new member): once the
// handler is let go, no other handling of the revoked member starts —
// the rest of its taken batch goes back unfinished, to the next owner.
// Before, the rest of the first 64-message batch (63 handlings) ran
// after the revoke.
func TestRevokeStopsTakenBatch(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered"} {
		for _, by := range []string{"close", "rebalance"} {
			t.Run(mode+"/"+by, func(t *testing.T) { revokeStopsTakenBatch(t, mode == "ordered", by == "rebalance") })
		}
	}
}

func revokeStopsTakenBatch(t *testing.T, ordered, rebalance bool) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	const n = 200
	for i := range n {
		_, err := p.Send(ctx, &Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	var mu sync.Mutex
	calls := map[string][]string{} // member: bodies, in call order
	blocked := make(chan struct{})
	unblock := make(chan struct{})
	var once sync.Once
	handler := func(member string) Handler {
		return HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
			mu.Lock()
			calls[member] = append(calls[member], string(m.Body))
			mu.Unlock()
			if member == "b" && string(m.Body) == "0" {
				once.Do(func() { close(blocked) })
				<-unblock
			}
			return nil
		})
	}
	opts := func(member string) []ConsumerOption {
		o := []ConsumerOption{WithMemberID(member), WithConcurrency(1), WithDrainTimeout(5 * time.Second)}
		if ordered {
			o = append(o, Ordered())
		}
		return o
	}
	// "b" holds the queue; "a" (first in the allocator's order) takes it
	// from it in the rebalance case.
	cb, err := b.NewConsumer("g", "t", handler("b"), opts("b")...)
	require.NoError(t, err)
	require.NoError(t, cb.Start(ctx))
	defer cb.Close()
	<-blocked
	cb.m.mu.Lock()
	run := cb.m.runs[0]
	cb.m.mu.Unlock()
	require.NotNil(t, run)

	revoked := make(chan error, 1)
	var ca *Consumer
	if rebalance {
		ca, err = b.NewConsumer("g", "t", handler("a"), opts("a")...)
		require.NoError(t, err)
		defer ca.Close()
		go func() { revoked <- ca.Start(ctx) }() // it waits for b's release
	} else {
		go func() { revoked <- cb.Close() }()
	}
	require.Eventually(t, func() bool { return run.h.posted(evRevoke) || run.h.posted(evClosing) },
		10*time.Second, time.Millisecond, "the revoke is posted")
	time.Sleep(20 * time.Millisecond) // the handler stays blocked past the revoke
	close(unblock)
	require.NoError(t, <-revoked)

	mu.Lock()
	got := append([]string(nil), calls["b"]...)
	mu.Unlock()
	assert.Equal(t, []string{"0"}, got, "handlings of the revoked member: only the one started before the revoke")
	if !rebalance {
		return
	}
	// The next owner gets the rest, from the first unfinished message on,
	// each once, in order.
	want := make([]string, 0, n-1)
	for i := 1; i < n; i++ {
		want = append(want, strconv.Itoa(i))
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls["a"]) >= n-1
	}, 10*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, want, calls["a"], fmt.Sprintf("the next owner's handlings (%d)", len(calls["a"])))
}
