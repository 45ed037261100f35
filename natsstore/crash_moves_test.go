package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/internal/crashtest"
	"github.com/ferrymq/ferry/natsstore"
)

// The moves crash test over natsstore (issue 27: the delay and retry
// crash tests, the root package's TestMovesCrash, over several brokers
// sharing one JetStream): brokers in child processes, one each, over one
// server of the parent's and one deployment (a prefix), each with a
// producer and a member of one group. A child sends messages with
// various due times (1 to 500 ms, a fifth not delayed, a fifth of the
// sends in batches); the handler fails the first attempt of every fourth
// (a retry through the retry topic and the levels) and every attempt of
// every seventh (poison: after its attempts, a dead letter). Several
// children run at once; each is SIGKILLed after a random number of lines
// and another started in its place, so brokers die while messages move,
// the one holding the delay lock included (another takes it over once
// its lease ends). Then the parent drains the deployment with brokers of
// its own and checks that nothing acknowledged is lost, nothing is
// handled early, and the internal moves stored nothing twice: each
// message once in its topic, each (message, attempt) once in the retry
// topic, each poison message once in the dead-letter topic. Handlings
// repeated (at-least-once redelivery to a handler) are counted and
// reported, not failed. About 15 s under -race.

const (
	natsMovesEnv      = "FERRY_NATS_MOVES_CHILD" // the child's run name
	natsMovesURL      = "FERRY_NATS_MOVES_URL"
	natsMovesPrefix   = "FERRY_NATS_MOVES_PREFIX"
	natsMovesTopic    = "jobs"
	natsMovesGroup    = "workers"
	natsMovesAttempts = 3
	natsMovesSlots    = 3 // children running at once
	natsMovesRuns     = 2 // children started in each slot, one after another
	// natsMovesTTL is the children's lease: how long a killed broker's
	// locks (its queues', the delay lock) outlive it.
	natsMovesTTL = time.Second
)

// natsMovesKind says what the handler does with message i: poison fails
// every attempt, retried fails the first.
func natsMovesKind(i int) (poison, retried bool) { return i%7 == 3, i%4 == 0 }

// natsMovesDelay is message i's delay: none for a fifth, else 1 to 500 ms.
func natsMovesDelay(i int) time.Duration {
	if i%5 == 0 {
		return 0
	}
	return time.Duration(1+(i*7919)%500) * time.Millisecond
}

// natsHandling is one call of the handler.
type natsHandling struct {
	body    string
	attempt int
	at      time.Time // on the system clock, as the brokers'
	hdrAt   time.Time // the delivery's HeaderDeliverAt, zero if none
	ok      bool
}

func (h natsHandling) line() string {
	var hdr int64
	if !h.hdrAt.IsZero() {
		hdr = h.hdrAt.UnixNano()
	}
	return fmt.Sprintf("got %s %d %d %d %t\n", h.body, h.attempt, h.at.UnixNano(), hdr, h.ok)
}

// natsMovesIndex returns the index i of body "r<run>m<i>".
func natsMovesIndex(body string) (int, error) {
	_, rest, ok := strings.Cut(body, "m")
	i, err := strconv.Atoi(rest)
	if !ok || err != nil {
		return 0, fmt.Errorf("body %q", body)
	}
	return i, nil
}

// natsMovesHandler calls record with each handling before it returns.
func natsMovesHandler(record func(natsHandling)) ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		h := natsHandling{body: string(m.Body), attempt: 1, at: time.Now()}
		if d, ok := ferry.DeliveryFrom(ctx); ok {
			h.attempt = d.Attempt
		}
		if s := m.Headers[ferry.HeaderDeliverAt]; s != "" {
			ns, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return ferry.Permanent(err)
			}
			h.hdrAt = time.Unix(0, ns)
		}
		i, err := natsMovesIndex(h.body)
		if err != nil {
			return ferry.Permanent(err)
		}
		poison, retried := natsMovesKind(i)
		h.ok = !poison && (!retried || h.attempt > 1)
		record(h)
		switch {
		case poison:
			return ferry.RetryAfter(errors.New("poison"), time.Duration(5+i%40)*time.Millisecond)
		case !h.ok:
			return ferry.RetryAfter(errors.New("first attempt fails"), 10*time.Millisecond+time.Duration(i%5)*30*time.Millisecond)
		}
		return nil
	})
}

// natsMovesNode is one broker of the deployment with a member of the
// group, and what it holds.
type natsMovesNode struct {
	nc    *nats.Conn
	store *natsstore.Store
	coord *natsstore.Coordinator
	b     *ferry.Broker
	c     *ferry.Consumer
}

// openNatsMovesNode connects to url and starts a broker over prefix's
// deployment, with member id of the group; create: it makes the topic
// first.
func openNatsMovesNode(ctx context.Context, url, prefix, id string, create bool, record func(natsHandling)) (*natsMovesNode, error) {
	n := &natsMovesNode{}
	var err error
	if n.nc, err = nats.Connect(url, nats.MaxReconnects(-1)); err != nil {
		return nil, err
	}
	js, err := jetstream.New(n.nc)
	if err == nil {
		n.store, err = natsstore.Open(ctx, js, natsstore.WithPrefix(prefix), natsstore.WithOpTimeout(5*time.Second))
	}
	if err == nil {
		n.coord, err = natsstore.NewCoordinator(ctx, js, natsstore.WithPrefix(prefix), natsstore.WithTTL(natsMovesTTL), natsstore.WithOpTimeout(5*time.Second))
	}
	if err == nil {
		n.b, err = ferry.NewBroker(ferry.WithStorage(n.store), ferry.WithCursorStore(n.store), ferry.WithCoordinator(n.coord))
	}
	if err == nil && create {
		err = n.b.CreateTopic(ctx, ferry.TopicMeta{Name: natsMovesTopic, Queues: 4})
	}
	if err == nil {
		n.c, err = n.b.NewConsumer(natsMovesGroup, natsMovesTopic, natsMovesHandler(record),
			ferry.WithRetry(natsMovesAttempts, 10*time.Millisecond), ferry.WithMemberID(id))
	}
	if err == nil {
		err = n.c.Start(ctx)
	}
	if err != nil {
		return nil, errors.Join(err, n.close())
	}
	return n, nil
}

func (n *natsMovesNode) close() error {
	var errs []error
	if n.c != nil {
		errs = append(errs, n.c.Close())
	}
	if n.b != nil {
		errs = append(errs, n.b.Close())
	}
	if n.coord != nil {
		errs = append(errs, n.coord.Close())
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	if n.nc != nil {
		n.nc.Close()
	}
	return errors.Join(errs...)
}

// natsMovesChild runs one broker until it is killed (or its stdin
// closes), printing "ack <body> <due ns, 0 if not delayed>" for each
// acknowledged send and a "got" line for each handling.
func natsMovesChild() int {
	run, url, prefix := os.Getenv(natsMovesEnv), os.Getenv(natsMovesURL), os.Getenv(natsMovesPrefix)
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
	die := func(what string, err error) int {
		say(fmt.Sprintf("error %s: %v\n", what, err))
		return 1
	}
	ctx := context.Background()
	n, err := openNatsMovesNode(ctx, url, prefix, "c"+run, false, func(h natsHandling) { say(h.line()) })
	if err != nil {
		return die("open", err)
	}
	p, err := n.b.NewProducer()
	if err != nil {
		return die("producer", err)
	}
	say("ready\n")
	msg := func(i int) *ferry.Message {
		m := &ferry.Message{Topic: natsMovesTopic, Key: strconv.Itoa(i % 16), Body: []byte("r" + run + "m" + strconv.Itoa(i))}
		if d := natsMovesDelay(i); d > 0 {
			m.DeliverAt = time.Now().Add(d)
		}
		return m
	}
	ack := func(m *ferry.Message) {
		var due int64
		if !m.DeliverAt.IsZero() {
			due = m.DeliverAt.UnixNano()
		}
		say(fmt.Sprintf("ack %s %d\n", m.Body, due))
	}
	tick := time.NewTicker(5 * time.Millisecond)
	for i, round := 0, 0; ; round++ {
		<-tick.C
		if round%5 == 4 {
			batch := make([]*ferry.Message, 5)
			for k := range batch {
				batch[k] = msg(i)
				i++
			}
			if _, err := p.SendBatch(ctx, batch); err != nil {
				return die("send batch", err)
			}
			for _, m := range batch {
				ack(m)
			}
			continue
		}
		m := msg(i)
		i++
		if _, err := p.Send(ctx, m); err != nil {
			return die("send", err)
		}
		ack(m)
	}
}

func TestMovesCrashNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no processes")
	}
	c := singleServer(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 27))
	prefix := fmt.Sprintf("mv%d", fresh.Add(1))
	ctx := t.Context()

	// The topic exists before the children start (each would make it).
	var mu sync.Mutex
	var hs []natsHandling
	okCount := map[string]int{}
	wake := make(chan struct{}, 1)
	record := func(h natsHandling) {
		mu.Lock()
		hs = append(hs, h)
		if h.ok {
			okCount[h.body]++
		}
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	setup, err := openNatsMovesNode(ctx, c.url(), prefix, "setup", true, record)
	require.NoError(t, err)
	rtopic, err := ferry.RetryTopic(natsMovesGroup, natsMovesTopic)
	require.NoError(t, err)
	// A group's cursor at the start of the retry topic keeps what the
	// group's retry readers are done with, to be counted (a system
	// topic's queue drops what every group with a cursor on it
	// committed). The topic is made by the first retry: of "sm0", which
	// fails its first attempt (and is not one of the children's).
	sp, err := setup.b.NewProducer()
	require.NoError(t, err)
	_, err = sp.Send(ctx, &ferry.Message{Topic: natsMovesTopic, Body: []byte("sm0")})
	require.NoError(t, err)
	ferrytest.WaitFor(t, 10*time.Second, "the retry topic made", func() bool { _, ok := setup.b.Topic(rtopic); return ok }, wake)
	audit, err := setup.b.ResetGroup(ctx, "audit", rtopic, ferry.ResetToEarliest())
	require.NoError(t, err)
	require.NoError(t, sp.Close())
	require.NoError(t, setup.close())

	// Who holds the delay lock (level 0's lock in group ferry-delay: see
	// the root package's delay.go), over time: a member per process.
	js := c.connect(t)
	locks, err := js.KeyValue(ctx, prefix+"_locks")
	require.NoError(t, err)
	watch, err := locks.Watch(ctx, "ferry-delay.>")
	require.NoError(t, err)
	var hmu sync.Mutex
	var holders []string // in the order they took the lock
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for e := range watch.Updates() { // read until Stop closes it
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			h := holderOf(e.Value())
			hmu.Lock()
			if len(holders) == 0 || holders[len(holders)-1] != h {
				holders = append(holders, h)
			}
			hmu.Unlock()
		}
	}()
	stopWatch := func() {
		if watch != nil {
			_ = watch.Stop()
			<-watched
			watch = nil
		}
	}
	defer stopWatch()

	// natsMovesSlots children at once, each killed after a random number
	// of lines and followed by the next of its slot.
	type result struct {
		run    int
		lines  []string
		stderr string
		err    error
	}
	results := make(chan result, natsMovesSlots*natsMovesRuns)
	lines := make([][]int, natsMovesSlots)
	for s := range lines {
		for range natsMovesRuns {
			lines[s] = append(lines[s], 300+rng.IntN(900))
		}
	}
	var wg sync.WaitGroup
	for s := range natsMovesSlots {
		wg.Go(func() {
			for k, n := range lines[s] {
				run := s*natsMovesRuns + k
				got, stderr, _, err := crashtest.Run([]string{natsMovesEnv + "=" + strconv.Itoa(run),
					natsMovesURL + "=" + c.url(), natsMovesPrefix + "=" + prefix}, n)
				results <- result{run, got, stderr, err}
			}
		})
	}
	wg.Wait()
	close(results)
	acked := map[string]time.Time{} // body: due time, zero if not delayed
	for r := range results {
		require.NoError(t, r.err)
		require.NotContains(t, r.stderr, "DATA RACE", "the child")
		if r.stderr != "" {
			t.Logf("run %d: the child's stderr: %s", r.run, r.stderr)
		}
		n := 0
		for _, l := range r.lines {
			f := strings.Fields(l)
			switch {
			case f[0] == "ready":
			case f[0] == "ack" && len(f) == 3:
				due, err := strconv.ParseInt(f[2], 10, 64)
				require.NoError(t, err, l)
				acked[f[1]] = time.Time{}
				if due != 0 {
					acked[f[1]] = time.Unix(0, due)
				}
				n++
			case f[0] == "got" && len(f) == 6:
				att, err1 := strconv.Atoi(f[2])
				at, err2 := strconv.ParseInt(f[3], 10, 64)
				hdr, err3 := strconv.ParseInt(f[4], 10, 64)
				require.NoError(t, errors.Join(err1, err2, err3), l)
				h := natsHandling{body: f[1], attempt: att, at: time.Unix(0, at), ok: f[5] == "true"}
				if hdr != 0 {
					h.hdrAt = time.Unix(0, hdr)
				}
				record(h)
			default:
				t.Fatalf("run %d: the child said %q (stderr: %s)", r.run, l, r.stderr)
			}
		}
		t.Logf("run %d: killed after %d lines, %d sends acknowledged", r.run, len(r.lines), n)
	}
	require.NotEmpty(t, acked)
	hmu.Lock()
	byChildren := len(holders)
	hmu.Unlock()

	// Drain with brokers of the parent's: the children's leases end
	// within natsMovesTTL.
	var nodes []*natsMovesNode
	closeAll := func() error {
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.close())
		}
		nodes = nil
		return errors.Join(errs...)
	}
	defer func() { assert.NoError(t, closeAll()) }()
	for i := range 2 {
		n, err := openNatsMovesNode(ctx, c.url(), prefix, "drain"+strconv.Itoa(i), false, record)
		require.NoError(t, err)
		nodes = append(nodes, n)
	}
	b := nodes[0].b
	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for body := range acked {
			i, err := natsMovesIndex(body)
			require.NoError(t, err)
			if poison, _ := natsMovesKind(i); !poison && okCount[body] == 0 {
				k++
			}
		}
		return k
	}
	ferrytest.WaitFor(t, 60*time.Second, "every acknowledged message handled", func() bool { return missing() == 0 }, wake)
	quiet := func() bool {
		for _, tm := range b.Topics() {
			group := natsMovesGroup
			if ferry.IsDelayTopic(tm.Name) {
				group = "ferry-delay"
			} else if tm.Name != natsMovesTopic && tm.Name != rtopic {
				continue
			}
			lag, err := b.Lag(ctx, group, tm.Name)
			if err != nil || lag.Lag != 0 {
				return false
			}
		}
		return true
	}
	ferrytest.WaitFor(t, 60*time.Second, "nothing pending", quiet, wake)
	stopWatch()
	// The last child to hold the delay lock was killed holding it: a
	// broker of the parent's took it over.
	t.Logf("the delay lock was taken %d times by the children's brokers, %d in all: %v", byChildren, len(holders), holders)
	require.GreaterOrEqual(t, len(holders), 2, "the delay lock passed from a killed broker to another")

	// What the moves stored.
	entries := func(topic string, kept []int64, key func(*ferry.EnhancedMessage) string) map[string]int {
		tm, ok := b.Topic(topic)
		require.True(t, ok, topic)
		out := map[string]int{}
		buf := make([]*ferry.EnhancedMessage, 256)
		for qi := range tm.Queues {
			q, err := b.Queue(topic, qi)
			require.NoError(t, err)
			oldest, next := q.Offsets()
			from := int64(0) // everything kept, but before the audit's cursor
			if kept != nil {
				from = kept[qi]
			}
			require.LessOrEqual(t, oldest, from, "%s queue %d lost messages to retention", topic, qi)
			for off := oldest; off < next; {
				n, err := q.Read(ctx, off, buf)
				require.NoError(t, err)
				for _, m := range buf[:n] {
					out[key(m)]++
				}
				off += int64(n)
			}
		}
		return out
	}
	body := func(m *ferry.EnhancedMessage) string { return string(m.Body) }
	inTopic := entries(natsMovesTopic, nil, body)
	inRetry := entries(rtopic, audit, func(m *ferry.EnhancedMessage) string { return string(m.Body) + " " + m.Headers[ferry.HeaderAttempts] })
	inDLQ := entries("%DLQ%"+natsMovesGroup, nil, body)
	dups := func(what string, counts map[string]int) {
		var twice []string
		extra := 0
		for k, n := range counts {
			if n > 1 {
				twice = append(twice, fmt.Sprintf("%s ×%d", k, n))
				extra += n - 1
			}
		}
		sort.Strings(twice)
		t.Logf("%s: %d entries, %d stored more than once (%d extra)", what, len(counts), len(twice), extra)
		assert.Empty(t, twice, "%s: stored more than once", what)
	}
	dups("topic", inTopic)
	dups("retry topic (message, attempt)", inRetry)
	dups("dead letters", inDLQ)

	mu.Lock()
	defer mu.Unlock()
	var lost, early, redelivered []string
	handled := map[string]int{} // (body, attempt): handlings
	for _, h := range hs {
		handled[h.body+" "+strconv.Itoa(h.attempt)]++
		due, ok := acked[h.body]
		if !ok {
			continue
		}
		if !due.IsZero() && h.at.Before(due) || !h.hdrAt.IsZero() && h.at.Before(h.hdrAt) {
			early = append(early, fmt.Sprintf("%s attempt %d at %v, due %v, its delivery due %v", h.body, h.attempt,
				h.at.Format(time.StampMicro), due.Format(time.StampMicro), h.hdrAt.Format(time.StampMicro)))
		}
	}
	for k, n := range handled {
		if n > 1 {
			redelivered = append(redelivered, k)
		}
	}
	for body := range acked {
		i, err := natsMovesIndex(body)
		require.NoError(t, err)
		poison, _ := natsMovesKind(i)
		switch {
		case poison && inDLQ[body] == 0:
			lost = append(lost, body+" (no dead letter)")
		case !poison && inTopic[body] == 0:
			lost = append(lost, body+" (not in its topic)")
		case !poison && okCount[body] == 0:
			lost = append(lost, body+" (never handled)")
		}
	}
	sort.Strings(lost)
	sort.Strings(early)
	assert.Empty(t, lost, "lost")
	assert.Empty(t, early, "handled early")
	t.Logf("%d brokers killed: %d messages acknowledged, %d handlings; %d (message, attempt) pairs handled more than once (at-least-once redelivery)",
		natsMovesSlots*natsMovesRuns, len(acked), len(hs), len(redelivered))
}
