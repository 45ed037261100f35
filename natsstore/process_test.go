package natsstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
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

// The test binary re-executes itself as a group member when
// FERRY_NATS_CHILD names one (see childMain).
const (
	childEnv    = "FERRY_NATS_CHILD"
	childURL    = "FERRY_NATS_URL"
	childPrefix = "FERRY_NATS_PREFIX"
	childTTLEnv = "FERRY_NATS_TTL" // the coordinator's TTL, if not childTTL
	childTTL    = 2 * time.Second
	childCalls  = "FERRY_NATS_CALLS" // set: the member reports its calls (see childMain)
)

// childMain runs one member of group "billing" on topic "orders" until
// it is killed or told to stop (SIGTERM): every message it handles it
// reports on "<prefix>.handled" as "<member> <queue> <body>".
func childMain() int {
	member, url, prefix := os.Getenv(childEnv), os.Getenv(childURL), os.Getenv(childPrefix)
	ttl := childTTL
	if v := os.Getenv(childTTLEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		ttl = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := natsstore.Open(ctx, js, natsstore.WithPrefix(prefix))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer st.Close()
	co, err := natsstore.NewCoordinator(ctx, js, natsstore.WithPrefix(prefix), natsstore.WithTTL(ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer co.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer b.Close()
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		return nc.Publish(prefix+".handled", fmt.Appendf(nil, "%s %d %s", member, m.Queue, m.Body))
	})
	opts := []ferry.ConsumerOption{ferry.WithMemberID(member)}
	if os.Getenv(childCalls) != "" {
		// Every handler call and every queue taken, with the time, on
		// "<prefix>.calls" (see TestProcessPause).
		report := func(what string) {
			_ = nc.Publish(prefix+".calls", []byte(fmt.Sprintf("%s %s %d", member, what, time.Now().UnixNano())))
		}
		h = ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			report(fmt.Sprintf("call %d %d", m.Queue, m.Offset))
			return nil
		})
		opts = append(opts, ferry.Ordered(), ferry.WithOnAssigned(func(q ferry.QueueID) { report(fmt.Sprintf("assigned %d -1", q.Queue)) }))
	}
	c, err := b.NewConsumer("billing", "orders", h, opts...)
	if err == nil {
		err = c.Start(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	<-ctx.Done()
	_ = c.Close()
	return 0
}

type child struct {
	member string
	cmd    *exec.Cmd
	done   chan struct{}
}

func startChild(t *testing.T, c *cluster, prefix, member string, env ...string) *child {
	t.Helper()
	return startChildAt(t, c.url(), prefix, member, env...)
}

// startChildAt starts a member connected to url (a proxy's, say); env
// adds to its environment (childTTLEnv, childCalls).
func startChildAt(t *testing.T, url, prefix, member string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+member, childURL+"="+url, childPrefix+"="+prefix), env...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	ch := &child{member: member, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(ch.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-ch.done
	})
	return ch
}

// TestProcessKill runs a group of three member processes (this binary
// re-executed) over one server while a producer sends; one member is
// SIGKILLed: the others hold its queues within TTL + 1 s, and every
// message sent is handled.
func TestProcessKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no processes")
	}
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("p%d", fresh.Add(1))
	n := newNode(t, c, prefix)
	const queues = 6
	require.NoError(t, n.b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: queues}))

	var mu sync.Mutex
	seen := map[string]int{}
	wake := make(chan struct{}, 1)
	sub, err := n.js.Conn().Subscribe(prefix+".handled", func(m *nats.Msg) {
		body := strings.SplitN(string(m.Data), " ", 3)[2]
		mu.Lock()
		seen[body]++
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()

	kids := []*child{startChild(t, c, prefix, "k1"), startChild(t, c, prefix, "k2"), startChild(t, c, prefix, "k3")}
	locks, err := n.js.KeyValue(ctx, prefix+"_locks") // newNode made it, with the children's TTL
	require.NoError(t, err)
	w, err := locks.Watch(ctx, "billing.orders.*")
	require.NoError(t, err)
	defer func() {
		// Read only while waiting, the watch falls behind the lock
		// renewals; past 256 updates its delivery goroutine blocks,
		// and stays blocked after Stop unless the channel is drained
		// (until the watch closes it).
		_ = w.Stop()
		for range w.Updates() {
		}
	}()
	held := make([]string, queues)
	count := func(hs []string, m string) int {
		k := 0
		for _, h := range hs {
			if h == m {
				k++
			}
		}
		return k
	}
	// waitFor follows the lock keys until ok holds.
	waitFor := func(what string, ok func([]string) bool) {
		t.Helper()
		for !ok(held) {
			select {
			case e := <-w.Updates():
				if e == nil {
					continue
				}
				q, _ := strconv.Atoi(e.Key()[strings.LastIndexByte(e.Key(), '.')+1:])
				held[q] = ""
				if e.Operation() == jetstream.KeyValuePut {
					held[q] = holderOf(e.Value())
				}
			case <-ctx.Done():
				t.Fatalf("%s: holders %v", what, held)
			}
		}
	}
	waitFor("three members split the queues", func(hs []string) bool {
		return count(hs, "k1") == 2 && count(hs, "k2") == 2 && count(hs, "k3") == 2
	})

	p, err := n.b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	var sent []string
	sendN := func(phase string, k int) {
		for i := range k {
			b := fmt.Sprintf("%s-%d", phase, i)
			_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: b, Body: []byte(b)})
			require.NoError(t, err)
			sent = append(sent, b)
		}
	}
	sendN("before", 300)

	require.NoError(t, kids[0].cmd.Process.Signal(syscall.SIGKILL))
	<-kids[0].done
	killed := time.Now()
	sendN("during", 300)
	waitFor("k2 and k3 take k1's queues", func(hs []string) bool {
		return count(hs, "k2") == 3 && count(hs, "k3") == 3
	})
	took := time.Since(killed)
	t.Logf("k1's queues taken over %v after its SIGKILL (TTL %v)", took.Round(10*time.Millisecond), childTTL)
	require.Less(t, took, childTTL+time.Second)
	sendN("after", 300)

	for {
		mu.Lock()
		missing := 0
		for _, b := range sent {
			if seen[b] == 0 {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		select {
		case <-wake:
		case <-ctx.Done():
			t.Fatalf("%d of %d messages never handled", missing, len(sent))
		}
	}
	dups := 0
	mu.Lock()
	for _, b := range sent {
		dups += seen[b] - 1
	}
	mu.Unlock()
	t.Logf("%d messages, all handled, %d more than once", len(sent), dups)
	for _, k := range kids[1:] {
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.done:
		case <-ctx.Done():
			t.Fatal("a member did not stop on SIGTERM")
		}
	}
}
