package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
	"github.com/ferrymq/ferry/internal/crashtest"
)

// The delay crash test re-executes the test binary as a child (the init
// below runs it instead of the tests) that opens a filestore broker and,
// from its first line on, sends messages with various due times (a fifth
// not delayed, the others due 1 to 500 ms later) while a concurrent
// consumer fails the first attempt of every fourth message with
// RetryAfter (10 to 130 ms), so delayed messages hop levels, fall due and
// retries go round the retry topic and the levels, all at once. It prints
// every send that Send acknowledged and every handling, and the parent
// SIGKILLs it after a random number of lines. The parent then opens the
// store in a broker of its own, runs the same consumer and waits until
// every acknowledged message was handled successfully (before the kill
// or after), and until nothing is pending: no group lag on the topic, the
// retry topic and the delay levels. It checks that no handling came
// before its due time (the message's, and for a retry its retry's) and
// that every message handled successfully more than once was moving when
// the child was killed: it had an event (sent, handled, a hop or due
// time of its own or of its retry) within crashMoving before the kill.
// Duplicates are reported. FERRY_DELAY_CRASH_ROUNDS sets the rounds
// (default 3, about 2 s each under -race).

const (
	delayCrashEnv    = "FERRY_DELAY_CRASH_CHILD" // the store's directory
	delayCrashRounds = "FERRY_DELAY_CRASH_ROUNDS"
	crashTopic       = "jobs"
	crashGroup       = "g"
	// crashMoving is how long before the kill a message's last event may
	// be for a duplicate of it to count as moving at the kill: the delay
	// levels commit every 100 ms, the consumer as it goes.
	crashMoving = 500 * time.Millisecond
)

func init() {
	if dir := os.Getenv(delayCrashEnv); dir != "" {
		delayCrashChild(dir)
		os.Exit(0)
	}
}

// crashStore opens the store as the child and the parent do. SyncNever:
// SIGKILL ends the process, not the machine, so acknowledged writes are
// in the page cache (filestore's own crash test checks that they survive).
// Cursor commits are written before they are acknowledged only under
// SyncAlways, so SyncNever would add duplicates: SyncEvery keeps them few.
func crashStore(dir string) (*filestore.Store, error) {
	return filestore.Open(dir, filestore.WithSync(filestore.SyncEvery(5*time.Millisecond)))
}

// crashDelay is message i's delay: none for a fifth, else 1 to 500 ms.
func crashDelay(i int) time.Duration {
	if i%5 == 0 {
		return 0
	}
	return time.Duration(1+(i*7919)%500) * time.Millisecond
}

// crashRetry is the wait before the retry of message i, whose first
// attempt fails when i%4 == 0.
func crashRetry(i int) (time.Duration, bool) {
	return 10*time.Millisecond + time.Duration(i%5)*30*time.Millisecond, i%4 == 0
}

// handling is one call of the handler.
type handling struct {
	body    string
	attempt int
	at      time.Time // on the system clock, as the broker's
	hdrAt   time.Time // the delivery's HeaderDeliverAt, zero if none
	ok      bool
	child   bool
}

func (h handling) line() string {
	var hdr int64
	if !h.hdrAt.IsZero() {
		hdr = h.hdrAt.UnixNano()
	}
	return fmt.Sprintf("got %s %d %d %d %t\n", h.body, h.attempt, h.at.UnixNano(), hdr, h.ok)
}

// crashHandler calls record with each handling (before it returns) and
// fails the first attempt of the messages crashRetry says.
func crashHandler(record func(handling)) ferry.Handler {
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
		i, err := strconv.Atoi(strings.TrimPrefix(h.body, "m"))
		if err != nil {
			return ferry.Permanent(err)
		}
		wait, fails := crashRetry(i)
		h.ok = !fails || h.attempt > 1
		record(h)
		if !h.ok {
			return ferry.RetryAfter(errors.New("first attempt fails"), wait)
		}
		return nil
	})
}

func crashConsumer(b *ferry.Broker, record func(handling)) (*ferry.Consumer, error) {
	return b.NewConsumer(crashGroup, crashTopic, crashHandler(record), ferry.WithRetry(5, 20*time.Millisecond))
}

// delayCrashChild runs until it is killed (or its stdin closes: the
// parent is gone), printing "ack <body> <due ns, 0 if not delayed>
// <ack ns>" for each acknowledged send and a "got" line for each handling,
// each line in one write.
func delayCrashChild(dir string) {
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
	ctx := context.Background()
	s, err := crashStore(dir)
	if err != nil {
		die("open", err)
	}
	b, err := ferry.NewBroker(ferry.WithStorage(s), ferry.WithCursorStore(s))
	if err != nil {
		die("broker", err)
	}
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: crashTopic, Queues: 2}); err != nil {
		die("create", err)
	}
	c, err := crashConsumer(b, func(h handling) { say(h.line()) })
	if err != nil {
		die("consumer", err)
	}
	if err := c.Start(ctx); err != nil {
		die("start", err)
	}
	p, err := b.NewProducer()
	if err != nil {
		die("producer", err)
	}
	say("ready\n")
	msg := func(i int) *ferry.Message {
		m := &ferry.Message{Topic: crashTopic, Key: strconv.Itoa(i % 16), Body: []byte("m" + strconv.Itoa(i))}
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
		say(fmt.Sprintf("ack %s %d %d\n", m.Body, due, time.Now().UnixNano()))
	}
	tick := time.NewTicker(time.Millisecond)
	for i, round := 0, 0; ; round++ {
		<-tick.C
		if round%5 == 4 { // a batch
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
		for range 2 {
			m := msg(i)
			i++
			if _, err := p.Send(ctx, m); err != nil {
				die("send", err)
			}
			ack(m)
		}
	}
}

// crashActions returns the times a message placed at placed, due at due,
// acts in the levels: the end of each hop, then its due time (as delay.go
// places it: level n holds waits of 2ⁿ to 2ⁿ⁺¹ windows for 2ⁿ windows,
// and under two windows it waits in level 0 for its due time).
func crashActions(placed, due time.Time) []time.Time {
	const window = 50 * time.Millisecond
	var out []time.Time
	for now := placed; ; {
		r := due.Sub(now)
		if r < 2*window {
			return append(out, due)
		}
		hop := window
		for hop*4 <= r {
			hop *= 2
		}
		now = now.Add(hop)
		out = append(out, now)
	}
}

func TestDelayCrash(t *testing.T) {
	rounds := 3
	if s := os.Getenv(delayCrashRounds); s != "" {
		var err error
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 15))
	var sent, dups, moving, retried int
	for r := range rounds {
		st := delayCrashRound(t, r, 3000+rng.IntN(5000))
		sent, dups, moving, retried = sent+st.sent, dups+st.dups, moving+st.moving, retried+st.retried
		if t.Failed() {
			return
		}
	}
	t.Logf("%d rounds: %d messages acknowledged, %d failed attempts retried, %d duplicates (of %d messages moving at a kill)", rounds, sent, retried, dups, moving)
}

type crashStats struct{ sent, dups, moving, retried int }

// delayCrashRound runs a child, kills it after lines lines, drains the
// store and checks it.
func delayCrashRound(t *testing.T, round, lines int) crashStats {
	dir := t.TempDir()
	got, stderr, kill, err := crashtest.Run([]string{delayCrashEnv + "=" + dir}, lines)
	require.NoError(t, err)
	require.NotContains(t, stderr, "DATA RACE", "the child")

	type sentMsg struct{ due, acked time.Time }
	acked := map[string]sentMsg{}
	var hs []handling
	for _, l := range got {
		f := strings.Fields(l)
		switch {
		case f[0] == "ready":
		case f[0] == "ack" && len(f) == 4:
			due, err1 := strconv.ParseInt(f[2], 10, 64)
			at, err2 := strconv.ParseInt(f[3], 10, 64)
			require.NoError(t, errors.Join(err1, err2), l)
			m := sentMsg{acked: time.Unix(0, at)}
			if due != 0 {
				m.due = time.Unix(0, due)
			}
			acked[f[1]] = m
		case f[0] == "got" && len(f) == 6:
			att, err1 := strconv.Atoi(f[2])
			at, err2 := strconv.ParseInt(f[3], 10, 64)
			hdr, err3 := strconv.ParseInt(f[4], 10, 64)
			require.NoError(t, errors.Join(err1, err2, err3), l)
			h := handling{body: f[1], attempt: att, at: time.Unix(0, at), ok: f[5] == "true", child: true}
			if hdr != 0 {
				h.hdrAt = time.Unix(0, hdr)
			}
			hs = append(hs, h)
		default:
			t.Fatalf("round %d: the child said %q (stderr: %s)", round, l, stderr)
		}
	}
	require.NotEmpty(t, acked, "round %d: the child acknowledged nothing in %d lines", round, len(got))

	// Drain in a broker of the parent's.
	s, err := crashStore(dir)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	b, err := ferry.NewBroker(ferry.WithStorage(s), ferry.WithCursorStore(s))
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	var mu sync.Mutex
	wake := make(chan struct{}, 1)
	okCount := map[string]int{}
	for _, h := range hs {
		if h.ok {
			okCount[h.body]++
		}
	}
	c, err := crashConsumer(b, func(h handling) {
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
	ctx := t.Context()
	require.NoError(t, c.Start(ctx))
	defer func() { require.NoError(t, c.Close()) }()
	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for body := range acked {
			if okCount[body] == 0 {
				n++
			}
		}
		return n
	}
	ferrytest.WaitFor(t, 30*time.Second, fmt.Sprintf("round %d: every acknowledged message handled", round), func() bool { return missing() == 0 }, wake)
	// Then until nothing is pending, so that every duplicate is counted.
	quiet := func() bool {
		for _, tm := range b.Topics() {
			group := crashGroup
			if ferry.IsDelayTopic(tm.Name) {
				group = "ferry-delay"
			} else if tm.Name != crashTopic && tm.Name != ferry.RetryTopic(crashGroup, crashTopic) {
				continue
			}
			lag, err := b.Lag(ctx, group, tm.Name)
			if err != nil || lag.Lag != 0 {
				return false
			}
		}
		return true
	}
	ferrytest.WaitFor(t, 30*time.Second, fmt.Sprintf("round %d: nothing pending", round), quiet, wake)

	mu.Lock()
	defer mu.Unlock()
	// Never early; which messages were moving at the kill.
	movingAt := map[string]bool{}
	near := func(at time.Time) bool { return !at.Before(kill.Add(-crashMoving)) && !at.After(kill) }
	for body, m := range acked {
		if near(m.acked) {
			movingAt[body] = true
		}
		if !m.due.IsZero() {
			for _, at := range crashActions(m.acked, m.due) {
				movingAt[body] = movingAt[body] || near(at)
			}
		}
	}
	st := crashStats{sent: len(acked)}
	early := 0
	for _, h := range hs {
		m, ok := acked[h.body]
		if !ok {
			continue // its send was not acknowledged before the kill
		}
		if !m.due.IsZero() && h.at.Before(m.due) || !h.hdrAt.IsZero() && h.at.Before(h.hdrAt) {
			early++
			if early <= 5 {
				t.Errorf("round %d: %s (attempt %d, in the child %t) handled at %v, due %v, its delivery due %v",
					round, h.body, h.attempt, h.child, h.at.Format(time.StampMicro), m.due.Format(time.StampMicro), h.hdrAt.Format(time.StampMicro))
			}
		}
		if h.child && near(h.at) {
			movingAt[h.body] = true
		}
		if !h.ok {
			st.retried++
		}
		if !h.ok && h.child {
			wait, _ := crashRetry(atoi(t, strings.TrimPrefix(h.body, "m")))
			for _, at := range crashActions(h.at, h.at.Add(wait)) {
				movingAt[h.body] = movingAt[h.body] || near(at)
			}
		}
	}
	assert.Zero(t, early, "round %d: handled before due", round)
	var unexplained []string
	inChild := map[string]int{}
	for _, h := range hs {
		if h.ok && h.child {
			inChild[h.body]++
		}
	}
	var parentDup, crossDup int
	for body, n := range okCount {
		if _, ok := acked[body]; !ok || n < 2 {
			continue
		}
		if inChild[body] > 0 {
			crossDup++ // handled in the child, its cursor not yet written
		} else {
			parentDup++ // moved twice: a level's cursor not yet written
		}
		st.dups += n - 1
		if !movingAt[body] {
			unexplained = append(unexplained, fmt.Sprintf("%s ×%d", body, n))
		}
	}
	for body := range movingAt {
		if movingAt[body] {
			st.moving++
		}
	}
	assert.Empty(t, unexplained, "round %d: handled more than once though not moving at the kill", round)
	t.Logf("round %d: killed after %d lines; %d acknowledged, %d moving at the kill, %d duplicates: %d messages handled in the child and again, %d handled twice after the kill",
		round, lines, st.sent, st.moving, st.dups, crossDup, parentDup)
	return st
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
