package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/internal/crashtest"
)

// The transactional crash test (issue 29): a child process runs two
// brokers over one filestore directory and a FakeCoordinator, each with a
// Transactional member of one group reading "txin". For each message the
// handler sends two outputs, to "txout" (3 queues) and "txaudit" (1),
// both carrying a nonce of the call, and fails one attempt in five after
// sending (those outputs must never be seen). A goroutine takes leases
// away at random (lease loss, rebalances). The parent SIGKILLs the child
// at random points, FERRY_TXN_CRASH_KILLS times (default 50, 10 under
// -short), then handles what is left with brokers of its own and reads
// both output topics: every acknowledged input has exactly one output in
// each, from the same call, and no output of a failed call exists.

const (
	txnCrashEnv   = "FERRY_TXN_CRASH_CHILD" // the store's directory
	txnCrashRun   = "FERRY_TXN_CRASH_RUN"
	txnCrashKills = "FERRY_TXN_CRASH_KILLS"
	txnGroup      = "txg"
)

func init() {
	if dir := os.Getenv(txnCrashEnv); dir != "" {
		txnCrashChild(dir, os.Getenv(txnCrashRun))
		os.Exit(0)
	}
}

var txnNonce atomic.Uint64

// txnHandler sends body/nonce/a and body/nonce/b, then fails the call
// (after the sends) when fail says so.
func txnHandler(fail func(body string, attempt int) bool) ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		ob := ferry.OutboxFrom(ctx)
		attempt := 1
		if d, ok := ferry.DeliveryFrom(ctx); ok {
			attempt = d.Attempt
		}
		nonce := strconv.Itoa(os.Getpid()) + "." + strconv.FormatUint(txnNonce.Add(1), 10)
		failing := fail(string(m.Body), attempt)
		if failing {
			nonce = "FAILED." + nonce
		}
		for _, out := range []struct{ topic, part string }{{"txout", "a"}, {"txaudit", "b"}} {
			if err := ob.Send(&ferry.Message{Topic: out.topic, Key: m.Key, Body: []byte(string(m.Body) + "/" + nonce + "/" + out.part)}); err != nil {
				return err
			}
		}
		if failing {
			return errors.New("fails after sending")
		}
		return nil
	})
}

// txnFails fails the first attempt of one message in five.
func txnFails(body string, attempt int) bool {
	_, rest, _ := strings.Cut(body, "m")
	i, _ := strconv.Atoi(rest)
	return i%5 == 2 && attempt == 1
}

type txnCluster struct {
	brokers   []*ferry.Broker
	consumers []*ferry.Consumer
	coord     *ferrytest.FakeCoordinator
}

func openTxnCluster(dir string, n int) (*txnCluster, func() error, error) {
	s, err := crashStore(dir)
	if err != nil {
		return nil, nil, err
	}
	c := &txnCluster{coord: ferrytest.NewFakeCoordinator()}
	closeAll := func() error {
		var errs []error
		for _, cs := range c.consumers {
			errs = append(errs, cs.Close())
		}
		for _, b := range c.brokers {
			errs = append(errs, b.Close())
		}
		errs = append(errs, c.coord.Close(), s.Close())
		return errors.Join(errs...)
	}
	ctx := context.Background()
	for i := range n {
		b, err := ferry.NewBroker(ferry.WithStorage(s), ferry.WithCursorStore(s), ferry.WithCoordinator(c.coord))
		if err != nil {
			return nil, nil, errors.Join(err, closeAll())
		}
		c.brokers = append(c.brokers, b)
		if i == 0 {
			for name, queues := range map[string]int{"txin": 4, "txout": 3, "txaudit": 1} {
				if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: name, Queues: queues}); err != nil && !errors.Is(err, ferry.ErrTopicExists) {
					return nil, nil, errors.Join(err, closeAll())
				}
			}
		}
		cs, err := b.NewConsumer(txnGroup, "txin", txnHandler(txnFails), ferry.Transactional(),
			ferry.WithRetry(3, 5*time.Millisecond), ferry.WithConcurrency(8), ferry.WithMemberID("b"+strconv.Itoa(i)))
		if err != nil {
			return nil, nil, errors.Join(err, closeAll())
		}
		c.consumers = append(c.consumers, cs)
		if err := cs.Start(ctx); err != nil {
			return nil, nil, errors.Join(err, closeAll())
		}
	}
	return c, closeAll, nil
}

// txnCrashChild sends messages until it is killed, printing "ack <body>"
// for each acknowledged send, while a goroutine takes a random queue's
// lease away now and then.
func txnCrashChild(dir, run string) {
	go func() { // the parent is gone: end
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	var mu sync.Mutex
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := os.Stdout.WriteString(s); err != nil {
			os.Exit(4)
		}
	}
	c, _, err := openTxnCluster(dir, 2)
	if err != nil {
		say(fmt.Sprintf("error open: %v\n", err))
		os.Exit(1)
	}
	go func() {
		g := ferry.GroupKey{Scope: txnGroup, Topic: "txin"}
		for {
			time.Sleep(time.Duration(20+rand.IntN(60)) * time.Millisecond)
			c.coord.LoseLease(g, rand.IntN(4))
		}
	}()
	p, err := c.brokers[0].NewProducer()
	if err != nil {
		say(fmt.Sprintf("error producer: %v\n", err))
		os.Exit(1)
	}
	say("ready\n")
	ctx := context.Background()
	for i := 0; ; i++ {
		body := "r" + run + "m" + strconv.Itoa(i)
		if _, err := p.Send(ctx, &ferry.Message{Topic: "txin", Key: strconv.Itoa(i % 13), Body: []byte(body)}); err != nil {
			say(fmt.Sprintf("error send: %v\n", err))
			os.Exit(1)
		}
		say("ack " + body + "\n")
		if i%4 == 3 {
			time.Sleep(time.Millisecond)
		}
	}
}

func TestTransactionalCrash(t *testing.T) {
	kills := 50
	if testing.Short() {
		kills = 10
	}
	if s := os.Getenv(txnCrashKills); s != "" {
		var err error
		kills, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 29))
	dir := t.TempDir()

	acked := map[string]bool{}
	for run := range kills {
		lines := 20 + rng.IntN(400)
		got, stderr, _, err := crashtest.Run([]string{txnCrashEnv + "=" + dir, txnCrashRun + "=" + strconv.Itoa(run)}, lines)
		require.NoError(t, err)
		require.NotContains(t, stderr, "DATA RACE", "the child")
		for _, l := range got {
			f := strings.Fields(l)
			switch {
			case f[0] == "ready":
			case f[0] == "ack" && len(f) == 2:
				acked[f[1]] = true
			default:
				t.Fatalf("run %d: the child said %q (stderr: %s)", run, l, stderr)
			}
		}
	}
	require.NotEmpty(t, acked)
	t.Logf("%d kills, %d inputs acknowledged", kills, len(acked))

	// Finish with brokers of the parent's, then read the outputs.
	c, closeAll, err := openTxnCluster(dir, 1)
	require.NoError(t, err)
	defer func() { assert.NoError(t, closeAll()) }()
	b := c.brokers[0]
	ctx := t.Context()
	outputs := func(topic string) map[string][]string { // input body: the nonces of its outputs
		var mu sync.Mutex
		got := map[string][]string{}
		n := 0
		rc, err := b.NewConsumer("check-"+strconv.FormatInt(time.Now().UnixNano(), 10), topic, ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
			parts := strings.Split(string(m.Body), "/")
			mu.Lock()
			defer mu.Unlock()
			if len(parts) == 3 {
				got[parts[0]] = append(got[parts[0]], parts[1])
			} else {
				got["bad body "+string(m.Body)] = nil
			}
			n++
			return nil
		}), ferry.WithRetry(1, 0))
		require.NoError(t, err)
		require.NoError(t, rc.Start(ctx))
		ferrytest.WaitFor(t, 30*time.Second, "read "+topic, func() bool {
			lag, err := b.Lag(ctx, rc.Group(), topic)
			return err == nil && lag.Lag == 0
		}, nil)
		require.NoError(t, rc.Close())
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	ferrytest.WaitFor(t, 60*time.Second, "every input handled", func() bool {
		lag, err := b.Lag(ctx, txnGroup, "txin")
		return err == nil && lag.Lag == 0
	}, nil)
	out, audit := outputs("txout"), outputs("txaudit")
	bad := 0
	for body := range acked {
		a, au := out[body], audit[body]
		if len(a) != 1 || len(au) != 1 || a[0] != au[0] || strings.HasPrefix(a[0], "FAILED") {
			bad++
			if bad <= 10 {
				t.Errorf("input %s: outputs %v in txout, %v in txaudit (want one each, of one call that succeeded)", body, a, au)
			}
		}
	}
	for topic, got := range map[string]map[string][]string{"txout": out, "txaudit": audit} {
		for body, nonces := range got {
			failed := slices.ContainsFunc(nonces, func(n string) bool { return strings.HasPrefix(n, "FAILED") })
			if strings.HasPrefix(body, "bad body") || len(nonces) > 1 || failed {
				t.Errorf("%s: input %s: outputs of calls %v", topic, body, nonces)
			}
		}
	}
	assert.Zero(t, bad, "inputs without exactly one call's outputs")
}
