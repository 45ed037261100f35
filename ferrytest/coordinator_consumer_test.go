package ferrytest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// handled is one handling of a message.
type handled struct {
	member string
	queue  int
	body   string
}

// TestConsumerSessionExpiry runs two consumers of one group in two
// brokers that share a storage, a cursor store and a FakeCoordinator, as
// two processes would share a disk and a distributed coordinator. When
// the first consumer's session expires (and it cannot join again), its
// queues stop at once, the handler in flight sees its ctx cancelled, and
// the second consumer takes every queue; when the first can join again,
// it does, and the group splits the queues as before. Every message sent
// is handled (at least once).
func TestConsumerSessionExpiry(t *testing.T) {
	const queues = 4
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // the watchdog
	defer cancel()
	storage := ferry.NewMemoryStorage()
	cursors := ferry.NewMemoryCursorStore()
	coord := ferrytest.NewFakeCoordinator()
	defer storage.Close()
	defer cursors.Close()
	defer coord.Close()
	meta := ferry.TopicMeta{Name: "orders", Queues: queues}
	g := ferry.GroupKey{Scope: "billing", Topic: "orders"}
	newBroker := func() *ferry.Broker {
		b, err := ferry.NewBroker(ferry.WithStorage(storage), ferry.WithCursorStore(cursors), ferry.WithCoordinator(coord))
		require.NoError(t, err)
		require.NoError(t, b.CreateTopic(ctx, meta))
		return b
	}
	b1 := newBroker()
	defer b1.Close()
	b2 := newBroker()
	defer b2.Close()

	events := make(chan handled, 1024)
	blocked := make(chan struct{})   // the blocking handler started
	cancelled := make(chan struct{}) // and saw its ctx cancelled
	var blockOnce sync.Once
	h := ferry.HandlerFunc(func(hctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(hctx)
		if string(m.Body) == "block" && d.Member == "m1" {
			first := false
			blockOnce.Do(func() { first = true })
			if first {
				close(blocked)
				select {
				case <-hctx.Done():
					close(cancelled)
					return hctx.Err()
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		events <- handled{d.Member, m.Queue, string(m.Body)}
		return nil
	})
	var errMu sync.Mutex
	var reported []error
	onError := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		reported = append(reported, err)
	}
	opts := func(member string) []ferry.ConsumerOption {
		return []ferry.ConsumerOption{ferry.WithMemberID(member), ferry.WithRetry(5, time.Millisecond), ferry.WithOnError(onError)}
	}
	c1, err := b1.NewConsumer("billing", "orders", h, opts("m1")...)
	require.NoError(t, err)
	defer c1.Close()
	require.NoError(t, c1.Start(ctx))
	c2, err := b2.NewConsumer("billing", "orders", h, opts("m2")...)
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, c2.Start(ctx)) // holds its queues: m1 released them

	owner := map[int]string{}
	var mine1 []int
	for q := range queues {
		m, _, ok := coord.Holder(g, q)
		require.True(t, ok, "queue %d unheld", q)
		owner[q] = m
		if m == "m1" {
			mine1 = append(mine1, q)
		}
	}
	require.Len(t, mine1, queues/2, "the split of %d queues over 2 members: %v", queues, owner)

	producers := make([]*ferry.Producer, queues)
	for q := range producers {
		producers[q], err = b1.NewProducer(ferry.WithRouter(ferry.ManualRouter(q)))
		require.NoError(t, err)
	}
	sent := map[string]int{} // body -> queue
	seen := map[string][]handled{}
	send := func(q int, body string) {
		t.Helper()
		_, err := producers[q].Send(ctx, &ferry.Message{Topic: "orders", Body: []byte(body)})
		require.NoError(t, err)
		sent[body] = q
	}
	// await waits until every body is handled, returning who handled each
	// first (in this call).
	await := func(bodies ...string) map[string]handled {
		t.Helper()
		got := map[string]handled{}
		for _, b := range bodies {
			if hs := seen[b]; len(hs) > 0 {
				got[b] = hs[0]
			}
		}
		for len(got) < len(bodies) {
			select {
			case e := <-events:
				seen[e.body] = append(seen[e.body], e)
				if slices.Contains(bodies, e.body) {
					if _, ok := got[e.body]; !ok {
						got[e.body] = e
					}
				}
			case <-ctx.Done():
				var missing []string
				for _, b := range bodies {
					if _, ok := got[b]; !ok {
						missing = append(missing, b)
					}
				}
				t.Fatalf("messages never handled: %v", missing)
			}
		}
		return got
	}
	batch := func(phase string, n int) []string {
		var bodies []string
		for q := range queues {
			for i := range n {
				b := fmt.Sprintf("%s-q%d-%d", phase, q, i)
				send(q, b)
				bodies = append(bodies, b)
			}
		}
		return bodies
	}

	// 1. Both members consume their own queues.
	for b, e := range await(batch("before", 5)...) {
		assert.Equal(t, owner[sent[b]], e.member, "%s handled by %s", b, e.member)
	}

	// 2. m1 is in a handler when its session expires, and cannot join again.
	coord.FailJoins(g, "m1", errors.New("partitioned"))
	send(mine1[0], "block")
	select {
	case <-blocked:
	case <-ctx.Done():
		t.Fatal("the blocking message never reached m1")
	}
	require.True(t, coord.Expire(g, "m1"))
	select {
	case <-cancelled:
	case <-ctx.Done():
		t.Fatal("the handler's ctx was not cancelled when m1's session expired")
	}

	// 3. m2 takes every queue, the message m1 was handling included.
	for b, e := range await(append(batch("expired", 5), "block")...) {
		assert.Equal(t, "m2", e.member, "%s handled by %s while m1 was out", b, e.member)
	}
	for q := range queues {
		m, _, _ := coord.Holder(g, q)
		assert.Equal(t, "m2", m, "holder of queue %d while m1 was out", q)
	}

	// 4. m1 joins again and takes its queues back: probe each until m1
	// handles a message of it.
	coord.FailJoins(g, "m1", nil)
	for _, q := range mine1 {
		for i := 0; ; i++ {
			b := fmt.Sprintf("probe-q%d-%d", q, i)
			send(q, b)
			if await(b)[b].member == "m1" {
				break
			}
		}
	}
	for b, e := range await(batch("after", 5)...) {
		assert.Equal(t, owner[sent[b]], e.member, "%s handled by %s after m1 came back", b, e.member)
	}

	require.NoError(t, c1.Close())
	require.NoError(t, c2.Close())
	// Nothing lost; duplicates (at least once) are allowed.
	var dups int
	for b := range sent {
		require.NotEmpty(t, seen[b], "%s never handled", b)
		dups += len(seen[b]) - 1
	}
	t.Logf("%d messages sent, all handled, %d handled twice or more", len(sent), dups)
	errMu.Lock()
	defer errMu.Unlock()
	require.True(t, slices.ContainsFunc(reported, func(err error) bool { return errors.Is(err, ferry.ErrSessionExpired) }),
		"m1 did not report its session's expiry: %v", reported)
}
