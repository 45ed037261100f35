package natsstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestPartitionConsumer cuts a group member's connection off (a proxy
// that silently drops its traffic) while it owns a queue: the member
// gives the queue up (its lease's Lost, seen as OnRevoked) before the
// other member's lock of it is stored, the other member takes it and
// handles what is sent meanwhile, and no committed cursor ever moves
// back (the cut-off member commits nothing stale). Healed, the member
// joins again and the two split the queues.
func TestPartitionConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits for the TTL")
	}
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	prefix := fmt.Sprintf("pc%d", fresh.Add(1))
	opts := []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithTTL(ttl), natsstore.WithOpTimeout(500 * time.Millisecond)}
	px := newProxy(t, c.servers[0].Addr().String())

	type event struct {
		what string
		q    int
		at   time.Time
	}
	var mu sync.Mutex
	var events []event
	note := func(what string, q int) {
		mu.Lock()
		events = append(events, event{what, q, time.Now()})
		mu.Unlock()
	}
	tl := newTally()
	member := func(name string, nc *nats.Conn) (*ferry.Broker, *ferry.Consumer) {
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		st, err := natsstore.Open(ctx, js, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = st.Close() })
		co, err := natsstore.NewCoordinator(ctx, js, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = co.Close() })
		b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2}))
		cons, err := b.NewConsumer("billing", "orders", tl.handler(), ferry.WithMemberID(name),
			ferry.WithOnAssigned(func(q ferry.QueueID) { note(name+" assigned", q.Queue) }),
			ferry.WithOnRevoked(func(q ferry.QueueID) { note(name+" revoked", q.Queue) }))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cons.Close() })
		require.NoError(t, cons.Start(ctx))
		return b, cons
	}
	ncA, err := nats.Connect("nats://"+px.l.Addr().String(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(ncA.Close)
	_, ca := member("a", ncA)
	js := c.connect(t)
	bB, cb := member("b", js.Conn())
	waitAssigned(t, ctx, []int{1, 1}, ca, cb)
	qa := ca.Assigned()[0].Queue

	// Follow the lock keys and the cursors from outside.
	locks, err := js.KeyValue(ctx, prefix+"_locks")
	require.NoError(t, err)
	lw, err := locks.Watch(ctx, "billing.orders.*", jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer lw.Stop()
	var lockedByB time.Time
	lockDone := make(chan struct{})
	go func() {
		defer close(lockDone)
		for e := range lw.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			q, _ := strconv.Atoi(e.Key()[strings.LastIndexByte(e.Key(), '.')+1:])
			if q == qa && holderOf(e.Value()) == "b" && lockedByB.IsZero() {
				mu.Lock()
				lockedByB = time.Now()
				mu.Unlock()
			}
		}
	}()
	cursors, err := js.KeyValue(ctx, prefix+"_cursors")
	require.NoError(t, err)
	cw, err := cursors.WatchAll(ctx)
	require.NoError(t, err)
	defer cw.Stop()
	var back []string
	cursorDone := make(chan struct{})
	go func() {
		defer close(cursorDone)
		last := map[string]int64{}
		for e := range cw.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut || len(e.Value()) < 16 { // offset, token, then a finished set maybe
				continue
			}
			off := int64(binary.BigEndian.Uint64(e.Value()))
			if prev, ok := last[e.Key()]; ok && off < prev {
				mu.Lock()
				back = append(back, fmt.Sprintf("%s: %d after %d", e.Key(), off, prev))
				mu.Unlock()
			}
			last[e.Key()] = off
		}
	}()

	p, err := bB.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	all := send(t, ctx, p, "before", 100)
	tl.await(t, ctx, all)

	cut := time.Now()
	px.dropping.Store(true)
	waitAssigned(t, ctx, []int{2}, cb)
	t.Logf("cut off: b holds both queues %v later", time.Since(cut).Round(10*time.Millisecond))
	more := send(t, ctx, p, "cut", 100)
	tl.await(t, ctx, more)
	all = append(all, more...)

	mu.Lock()
	var revokedA time.Time
	for _, e := range events {
		if e.what == "a revoked" && e.q == qa && e.at.After(cut) {
			revokedA = e.at
			break
		}
	}
	locked := lockedByB
	mu.Unlock()
	require.False(t, revokedA.IsZero(), "a never gave queue %d up", qa)
	require.False(t, locked.IsZero(), "b's lock of queue %d never seen", qa)
	t.Logf("a gave queue %d up %v after the cut, b's lock stored %v after", qa, revokedA.Sub(cut).Round(10*time.Millisecond), locked.Sub(cut).Round(10*time.Millisecond))
	require.True(t, revokedA.Before(locked), "b locked queue %d before a knew it lost it", qa)

	px.dropping.Store(false) // heal: a joins again
	waitAssigned(t, ctx, []int{1, 1}, ca, cb)
	more = send(t, ctx, p, "healed", 100)
	tl.await(t, ctx, more)
	all = append(all, more...)

	lw.Stop()
	cw.Stop()
	<-lockDone
	<-cursorDone
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, back, "a committed cursor moved back")
	tl.mu.Lock()
	defer tl.mu.Unlock()
	dups := 0
	for _, b := range all {
		dups += len(tl.seen[b]) - 1
	}
	t.Logf("%d messages, all handled, %d more than once", len(all), dups)
}
