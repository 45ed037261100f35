package ferry_test

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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/internal/crashtest"
)

// The moves crash test (issue 27, defect 12: after a crash, dead letters
// and retries multiplied) runs several brokers in one child process over
// one filestore directory (a directory is locked by one process: the
// brokers share one *filestore.Store, as cursor store too, and a
// MemoryCoordinator), each with a member of one group. The child sends
// messages with various due times; the handler fails the first attempt
// of every fourth (a retry through the retry topic and the levels) and
// every attempt of every seventh (poison: after its attempts, a dead
// letter). The parent SIGKILLs the child after a random number of lines,
// starts it again over the same directory, several times, then drains
// the directory with brokers of its own. It checks that nothing
// acknowledged is lost, nothing is handled early, and that the internal
// moves stored nothing twice: each message once in its topic, each
// (message, attempt) once in the retry topic, each poison message once
// in the dead-letter topic. Handlings repeated (at-least-once
// redelivery to a handler) are counted and reported, not failed.
// FERRY_MOVES_CRASH_KILLS sets the kills (default 4, 2 under -short;
// about 3 s each under -race).

const (
	movesCrashEnv   = "FERRY_MOVES_CRASH_CHILD" // the store's directory
	movesCrashRun   = "FERRY_MOVES_CRASH_RUN"   // the child's run number
	movesCrashKills = "FERRY_MOVES_CRASH_KILLS"
	movesBrokers    = 3
	movesAttempts   = 3
)

func init() {
	if dir := os.Getenv(movesCrashEnv); dir != "" {
		movesCrashChild(dir, os.Getenv(movesCrashRun))
		os.Exit(0)
	}
}

// movesKind says what the handler does with message i: poison fails every
// attempt, retried fails the first.
func movesKind(i int) (poison, retried bool) { return i%7 == 3, i%4 == 0 }

// movesHandler calls record with each handling before it returns.
func movesHandler(record func(handling)) ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		h := handling{body: string(m.Body), attempt: 1, at: time.Now()}
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
		_, rest, ok := strings.Cut(h.body, "m")
		i, err := strconv.Atoi(rest)
		if !ok || err != nil {
			return ferry.Permanent(fmt.Errorf("body %q", h.body))
		}
		poison, retried := movesKind(i)
		h.ok = !poison && (!retried || h.attempt > 1)
		record(h)
		switch {
		case poison:
			return ferry.RetryAfter(errors.New("poison"), time.Duration(5+i%40)*time.Millisecond)
		case !h.ok:
			wait, _ := crashRetry(i)
			return ferry.RetryAfter(errors.New("first attempt fails"), wait)
		}
		return nil
	})
}

// movesCluster is several brokers over one store, each with a member of
// the group.
type movesCluster struct {
	brokers   []*ferry.Broker
	consumers []*ferry.Consumer
	coord     *ferry.MemoryCoordinator
}

func openMovesCluster(dir string, n int, record func(handling)) (*movesCluster, func() error, error) {
	s, err := crashStore(dir)
	if err != nil {
		return nil, nil, err
	}
	c := &movesCluster{coord: ferry.NewMemoryCoordinator()}
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
			if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: crashTopic, Queues: 4}); err != nil {
				return nil, nil, errors.Join(err, closeAll())
			}
		}
		cs, err := b.NewConsumer(crashGroup, crashTopic, movesHandler(record), ferry.WithRetry(movesAttempts, 10*time.Millisecond),
			ferry.WithMemberID("b"+strconv.Itoa(i)))
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

// movesCrashChild runs until it is killed (or its stdin closes), printing
// "ack <body> <due ns, 0 if not delayed>" for each acknowledged send and
// a "got" line for each handling.
func movesCrashChild(dir, run string) {
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
	die := func(what string, err error) {
		say(fmt.Sprintf("error %s: %v\n", what, err))
		os.Exit(1)
	}
	c, _, err := openMovesCluster(dir, movesBrokers, func(h handling) { say(h.line()) })
	if err != nil {
		die("open", err)
	}
	var ps []*ferry.Producer
	for _, b := range c.brokers {
		p, err := b.NewProducer()
		if err != nil {
			die("producer", err)
		}
		ps = append(ps, p)
	}
	say("ready\n")
	ctx := context.Background()
	msg := func(i int) *ferry.Message {
		m := &ferry.Message{Topic: crashTopic, Key: strconv.Itoa(i % 16), Body: []byte("r" + run + "m" + strconv.Itoa(i))}
		if d := crashDelay(i); d > 0 {
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
	tick := time.NewTicker(2 * time.Millisecond)
	for i, round := 0, 0; ; round++ {
		<-tick.C
		p := ps[round%len(ps)]
		if round%5 == 4 {
			batch := make([]*ferry.Message, 5)
			for k := range batch {
				batch[k] = msg(i)
				i++
			}
			if _, err := p.SendBatch(ctx, batch); err != nil {
				die("send batch", err)
			}
			for _, m := range batch {
				ack(m)
			}
			continue
		}
		m := msg(i)
		i++
		if _, err := p.Send(ctx, m); err != nil {
			die("send", err)
		}
		ack(m)
	}
}

func TestMovesCrash(t *testing.T) {
	kills := 4
	if testing.Short() {
		kills = 2
	}
	if s := os.Getenv(movesCrashKills); s != "" {
		var err error
		kills, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 27))
	dir := t.TempDir()

	acked := map[string]time.Time{} // body: due time, zero if not delayed
	var hs []handling
	for run := range kills {
		lines := 1500 + rng.IntN(3000)
		got, stderr, _, err := crashtest.Run([]string{movesCrashEnv + "=" + dir, movesCrashRun + "=" + strconv.Itoa(run)}, lines)
		require.NoError(t, err)
		require.NotContains(t, stderr, "DATA RACE", "the child")
		if stderr != "" {
			t.Logf("run %d: the child's stderr: %s", run, stderr)
		}
		n := 0
		for _, l := range got {
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
				hs = append(hs, parseHandling(t, l, f))
			default:
				t.Fatalf("run %d: the child said %q (stderr: %s)", run, l, stderr)
			}
		}
		t.Logf("run %d: killed after %d lines, %d sends acknowledged", run, len(got), n)
	}
	require.NotEmpty(t, acked)

	// Drain with brokers of the parent's.
	var mu sync.Mutex
	wake := make(chan struct{}, 1)
	okCount := map[string]int{}
	for _, h := range hs {
		if h.ok {
			okCount[h.body]++
		}
	}
	c, closeAll, err := openMovesCluster(dir, 2, func(h handling) {
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
	})
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			assert.NoError(t, closeAll())
		}
	}()
	b := c.brokers[0]
	ctx := t.Context()
	rtopic := retryTopic(t, crashGroup, crashTopic)
	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for body := range acked {
			if poison, _ := movesKind(movesIndex(t, body)); !poison && okCount[body] == 0 {
				n++
			}
		}
		return n
	}
	ferrytest.WaitFor(t, 60*time.Second, "every acknowledged message handled", func() bool { return missing() == 0 }, wake)
	quiet := func() bool {
		for _, tm := range b.Topics() {
			group := crashGroup
			if ferry.IsDelayTopic(tm.Name) {
				group = "ferry-delay"
			} else if tm.Name != crashTopic && tm.Name != rtopic {
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

	// What the moves stored: each message once in its topic, each
	// (message, attempt) once in the retry topic, each poison message once
	// in the dead-letter topic.
	entries := func(topic string, key func(*ferry.EnhancedMessage) string) map[string]int {
		tm, ok := b.Topic(topic)
		require.True(t, ok, topic)
		out := map[string]int{}
		buf := make([]*ferry.EnhancedMessage, 256)
		for qi := range tm.Queues {
			q, err := b.Queue(topic, qi)
			require.NoError(t, err)
			oldest, next := q.Offsets()
			require.Zero(t, oldest, "%s queue %d lost messages to retention", topic, qi)
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
	inTopic := entries(crashTopic, body)
	inRetry := entries(rtopic, func(m *ferry.EnhancedMessage) string { return string(m.Body) + " " + m.Headers[ferry.HeaderAttempts] })
	inDLQ := entries("%DLQ%"+crashGroup, body)
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
			early = append(early, fmt.Sprintf("%s attempt %d at %v, due %v, its delivery due %v", h.body, h.attempt, h.at.Format(time.StampMicro), due.Format(time.StampMicro), h.hdrAt.Format(time.StampMicro)))
		}
	}
	for k, n := range handled {
		if n > 1 {
			redelivered = append(redelivered, k)
		}
	}
	for body := range acked {
		poison, _ := movesKind(movesIndex(t, body))
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
	t.Logf("%d kills: %d messages acknowledged, %d handlings; %d (message, attempt) pairs handled more than once (at-least-once redelivery)",
		kills, len(acked), len(hs), len(redelivered))
	mu.Unlock()
	closed = true
	assert.NoError(t, closeAll())
	mu.Lock()
}

// movesIndex returns the index i of body "r<run>m<i>".
func movesIndex(t *testing.T, body string) int {
	t.Helper()
	_, rest, _ := strings.Cut(body, "m")
	return atoi(t, rest)
}

// parseHandling reads a handling's line, f its fields.
func parseHandling(t *testing.T, l string, f []string) handling {
	t.Helper()
	att, err1 := strconv.Atoi(f[2])
	at, err2 := strconv.ParseInt(f[3], 10, 64)
	hdr, err3 := strconv.ParseInt(f[4], 10, 64)
	require.NoError(t, errors.Join(err1, err2, err3), l)
	h := handling{body: f[1], attempt: att, at: time.Unix(0, at), ok: f[5] == "true", child: true}
	if hdr != 0 {
		h.hdrAt = time.Unix(0, hdr)
	}
	return h
}
