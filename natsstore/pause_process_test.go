package natsstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestProcessPause stops a member process (SIGSTOP) for twice its TTL
// while messages flow, and resumes it: the other member takes its queues
// meanwhile, and the resumed member calls its handler on no queue until
// it holds that queue again under a new lease (before, it handled
// messages 0-4 ms after SIGCONT that the new owner already had, which
// under Ordered handed a key's old message out after newer ones).
func TestProcessPause(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no processes")
	}
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("p%d", fresh.Add(1))
	n := newNode(t, c, prefix)
	const queues = 4
	require.NoError(t, n.b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: queues}))

	type rec struct {
		member, what string
		q            int
		at           time.Time
	}
	var mu sync.Mutex
	var recs []rec
	wake := make(chan struct{}, 1)
	sub, err := n.js.Conn().Subscribe(prefix+".calls", func(m *nats.Msg) {
		f := strings.Fields(string(m.Data)) // member what queue offset ns
		if len(f) != 5 {
			return
		}
		q, _ := strconv.Atoi(f[2])
		ns, _ := strconv.ParseInt(f[4], 10, 64)
		mu.Lock()
		recs = append(recs, rec{member: f[0], what: f[1], q: q, at: time.Unix(0, ns)})
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	waitFor := func(what string, ok func([]rec) bool) {
		t.Helper()
		for {
			mu.Lock()
			done := ok(recs)
			mu.Unlock()
			if done {
				return
			}
			select {
			case <-wake:
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("%s: not within the test's time", what)
			}
		}
	}
	calls := func(rs []rec, member string, since time.Time) int {
		k := 0
		for _, r := range rs {
			if r.member == member && r.what == "call" && !r.at.Before(since) {
				k++
			}
		}
		return k
	}

	k1 := startChild(t, c, prefix, "k1", childCalls+"=1")
	k2 := startChild(t, c, prefix, "k2", childCalls+"=1")
	p, err := n.b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	stopSending := make(chan struct{})
	var sending sync.WaitGroup
	sending.Add(1)
	go func() { // a message a millisecond, over every queue
		defer sending.Done()
		for i := 0; ; i++ {
			select {
			case <-stopSending:
				return
			case <-time.After(time.Millisecond):
			}
			if _, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: strconv.Itoa(i), Body: []byte(strconv.Itoa(i))}); err != nil && ctx.Err() == nil {
				t.Errorf("send: %v", err)
				return
			}
		}
	}()
	start := time.Now()
	waitFor("both members handle", func(rs []rec) bool { return calls(rs, "k1", start) > 20 && calls(rs, "k2", start) > 20 })

	require.NoError(t, k1.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	time.Sleep(2 * childTTL) // the pause: k1's leases expire meanwhile
	waitFor("k2 handles every queue while k1 is stopped", func(rs []rec) bool {
		seen := map[int]bool{}
		for _, r := range rs {
			if r.member == "k2" && r.what == "call" && r.at.After(stopped) {
				seen[r.q] = true
			}
		}
		return len(seen) == queues
	})
	resumed := time.Now()
	require.NoError(t, k1.cmd.Process.Signal(syscall.SIGCONT))
	time.Sleep(2 * childTTL) // k1 wakes, finds its leases gone, joins again
	close(stopSending)
	sending.Wait()

	mu.Lock()
	defer mu.Unlock()
	stale, after := 0, 0
	for _, r := range recs {
		if r.member != "k1" || r.what != "call" || r.at.Before(resumed) {
			continue
		}
		after++
		retaken := false
		for _, a := range recs {
			if a.member == "k1" && a.what == "assigned" && a.q == r.q && !a.at.Before(resumed) && !a.at.After(r.at) {
				retaken = true
				break
			}
		}
		if !retaken {
			stale++
			if stale <= 5 {
				t.Errorf("k1 called its handler on queue %d %v after SIGCONT without taking the queue again", r.q, r.at.Sub(resumed))
			}
		}
	}
	assert.Zero(t, stale, "handler calls of the resumed member under leases it had lost")
	t.Logf("k1 stopped %v; after SIGCONT it made %d handler calls, all under leases taken after it (%d records)", resumed.Sub(stopped).Round(time.Millisecond), after, len(recs))
	for _, k := range []*child{k1, k2} {
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, k := range []*child{k1, k2} {
		select {
		case <-k.done:
		case <-time.After(20 * time.Second):
			t.Error("a member did not stop on SIGTERM")
		}
	}
}
