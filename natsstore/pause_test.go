package natsstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// maxElection bounds a JetStream (Raft) leader election in nats-server
// v2.15: its election timeout is drawn from 4-9 s.
const maxElection = 9 * time.Second

// TestServerPause SIGSTOPs, for 20 s, the server process one member of a
// two-member group is connected to (a 3-node cluster of processes, R3
// queues, TTL 8 s), while a producer connected to the others sends to
// every queue each 10 ms; then SIGCONTs it. Every queue is handled again
// within TTL + the longest election (17 s) of the stop, while the server
// is still stopped, and after it continues no message waits longer than
// that either. (Issue 30 item 3: a server stopped for 12 s stalled all
// handling for 31.6 s once in three runs, and a member's rejoins were
// refused, "already in group", for 14 s. The other member's watch of
// the members bucket was served by the stopped server and told nothing
// until it continued, 20 s and more: 2 runs in 8 here before the watch
// was checked against the member's own heartbeats.) The stopped server
// holds what its clients send it and handles it when it continues: the
// member's renewals, deletes and joins land late, as in
// TestPartitionThreeTTLs. When it led the locks bucket, every member
// loses its leases until another leader is elected.
func TestServerPause(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: server processes, Raft elections")
	}
	t.Parallel() // waits, mostly: beside the availability tests
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := startProcCluster(t, ctx)
	const queues, pause = 4, 20 * time.Second
	// The stopped member's keys expire within a TTL of the stop, or at
	// the election of a bucket's new leader (at most maxElection) when
	// the server led it; the other member sees its key gone within TTL/6
	// (its watch checked against its heartbeats, the bucket's leader read
	// when the watch is behind) and its lock keys free within TTL/3 (a
	// Lock's safety net); the queues' streams elect leaders meanwhile.
	// Below the pause: the group must resume while the server is still
	// stopped.
	bound := availTTL + maxElection
	opts := []natsstore.Option{natsstore.WithPrefix("sp"), natsstore.WithReplicas(3), natsstore.WithTTL(availTTL)}
	connect := func(ps ...*serverProc) *nats.Conn {
		us := make([]string, len(ps))
		for i, p := range ps {
			us[i] = p.url()
		}
		nc, err := nats.Connect(strings.Join(us, ","), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	stopped := c.procs[0]

	type handling struct {
		q  int
		at time.Time
	}
	var mu sync.Mutex
	handled := map[string]handling{} // body -> first handling
	sentAt := map[string]time.Time{}
	member := func(name string, nc *nats.Conn) *ferry.Broker {
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
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: queues}))
		cons, err := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
			mu.Lock()
			if _, ok := handled[string(m.Body)]; !ok {
				handled[string(m.Body)] = handling{m.Queue, time.Now()}
			}
			mu.Unlock()
			return nil
		}), ferry.WithMemberID(name))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cons.Close() })
		require.NoError(t, cons.Start(ctx))
		return b
	}
	member("m1", connect(stopped, c.procs[1], c.procs[2])) // on the server to be stopped
	b2 := member("m2", connect(c.procs[1], c.procs[2]))

	// A key for each queue, then a sender per queue.
	p, err := b2.NewProducer()
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	keys := make([]string, queues)
	for i, found := 0, 0; found < queues; i++ {
		k := fmt.Sprintf("k%d", i)
		r, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: k, Body: []byte("probe-" + k)})
		require.NoError(t, err)
		if keys[r.Queue.Queue] == "" {
			keys[r.Queue.Queue] = k
			found++
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for q, k := range keys {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				body := fmt.Sprintf("q%d-%d", q, n)
				mu.Lock()
				sentAt[body] = time.Now()
				mu.Unlock()
				if _, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: k, Body: []byte(body)}); err != nil {
					mu.Lock()
					delete(sentAt, body) // not acknowledged: not awaited
					mu.Unlock()
				}
				select {
				case <-tick.C:
				case <-stop:
					return
				case <-ctx.Done():
					return
				}
			}
		})
	}
	stopSending := func() {
		if stop != nil {
			close(stop)
			wg.Wait()
			stop = nil
		}
	}
	defer stopSending()

	// firstAfter: per queue, the first handling of a message sent after
	// from; ok once every queue has one.
	firstAfter := func(from time.Time) (at []time.Time, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		at = make([]time.Time, queues)
		for body, h := range handled {
			if s, sent := sentAt[body]; sent && s.After(from) && (at[h.q].IsZero() || h.at.Before(at[h.q])) {
				at[h.q] = h.at
			}
		}
		for _, a := range at {
			if a.IsZero() {
				return at, false
			}
		}
		return at, true
	}
	awaitCond(t, ctx, "every queue handled", func() (bool, string) {
		_, ok := firstAfter(time.Now().Add(-time.Hour))
		return ok, ""
	})

	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGSTOP))
	stoppedAt := time.Now()
	time.Sleep(pause)
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGCONT))
	contAt := time.Now()

	var resumed []time.Duration
	awaitCond(t, ctx, "every queue handled after the stop", func() (bool, string) {
		at, ok := firstAfter(stoppedAt)
		resumed = resumed[:0]
		for _, a := range at {
			resumed = append(resumed, a.Sub(stoppedAt).Round(10*time.Millisecond))
		}
		return ok, fmt.Sprint(resumed)
	})
	time.Sleep(time.Until(contAt.Add(availTTL)))
	stopSending()
	var stall time.Duration
	awaitCond(t, ctx, "every message sent after the server continued handled", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		stall = 0
		missing := 0
		for body, s := range sentAt {
			if !s.After(contAt) {
				continue
			}
			h, ok := handled[body]
			if !ok {
				missing++
				continue
			}
			stall = max(stall, h.at.Sub(s))
		}
		return missing == 0, fmt.Sprintf("%d missing", missing)
	})
	t.Logf("server stopped %v: each queue handled again %v after the stop; after it continued, a message waited %v at most (TTL %v, bound %v)",
		pause, resumed, stall.Round(10*time.Millisecond), availTTL, bound)
	for q, d := range resumed {
		require.LessOrEqual(t, d, bound, "queue %d handled again %v after the stop", q, d)
	}
	require.LessOrEqual(t, stall, bound, "a message sent after the server continued waited %v", stall)
}
