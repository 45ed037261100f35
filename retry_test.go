package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
)

// attemptLog records every handler call: body -> the attempts seen, and
// the clock at each.
type attemptLog struct {
	clock    ferry.Clock
	mu       sync.Mutex
	attempts map[string][]int
	at       map[string][]time.Time
	members  map[string][]string
	wake     chan struct{}
	fail     func(body string, attempt int) error
}

func newAttemptLog(c ferry.Clock, fail func(string, int) error) *attemptLog {
	return &attemptLog{clock: c, attempts: map[string][]int{}, at: map[string][]time.Time{}, members: map[string][]string{},
		wake: make(chan struct{}, 1), fail: fail}
}

func (l *attemptLog) handler() ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		body := string(m.Body)
		l.mu.Lock()
		l.attempts[body] = append(l.attempts[body], d.Attempt)
		l.at[body] = append(l.at[body], l.clock.Now())
		l.members[body] = append(l.members[body], d.Member)
		l.mu.Unlock()
		select {
		case l.wake <- struct{}{}:
		default:
		}
		return l.fail(body, d.Attempt)
	})
}

func (l *attemptLog) seen(body string) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.attempts[body]...)
}

func (l *attemptLog) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.attempts)
}

// deadLetters reads the dead-letter topic from the start.
func deadLetters(t *testing.T, b *ferry.Broker, topic string) []*ferry.EnhancedMessage {
	t.Helper()
	var out []*ferry.EnhancedMessage
	pc, err := b.NewPullConsumer("dlq-reader-"+strconv.Itoa(int(time.Now().UnixNano())), topic)
	require.NoError(t, err)
	defer pc.Close()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		msgs, err := pc.Poll(ctx, 100)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		require.NoError(t, err)
		out = append(out, msgs...)
	}
}

var errPoison = errors.New("poison")

// TestRetryPoisonDoesNotStopQueue: one message that always fails, among
// 10,000 on one queue, no longer holds the queue while it waits out its
// backoffs (it held it after MaxSpan messages: 1,999 of 9,999 handled):
// every other is handled with the clock standing still, and the poison
// one is dead-lettered after its attempts, each on the retry topic.
func TestRetryPoisonDoesNotStopQueue(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := newTopic(t, 1, ferry.WithClock(clock))
	log := newAttemptLog(clock, func(body string, _ int) error {
		if body == "m5000" {
			return errPoison
		}
		return nil
	})
	c := startConsumer(t, b, "g", log.handler(), ferry.WithRetry(4, time.Second), ferry.WithMaxSpan(1000))
	produce(t, b, "t", "m", 10_000, 1)
	ferrytest.WaitFor(t, 0, "every other message, the clock standing still", func() bool { return log.distinct() == 10_000 }, log.wake)
	assert.Equal(t, []int{1}, log.seen("m5000"))

	runClock(t, clock, "the poison message's four attempts", func() bool { return len(log.seen("m5000")) == 4 }, log.wake)
	assert.Equal(t, []int{1, 2, 3, 4}, log.seen("m5000"))
	log.mu.Lock()
	at := log.at["m5000"]
	log.mu.Unlock()
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		assert.GreaterOrEqual(t, at[i+1].Sub(at[i]), wait, "attempt %d came early", i+2)
	}
	ferrytest.WaitFor(t, 0, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 }, nil)
	dl := deadLetters(t, b, "%DLQ%g")
	require.Len(t, dl, 1)
	assert.Equal(t, "m5000", string(dl[0].Body))
	assert.Equal(t, "4", dl[0].Headers[ferry.HeaderAttempts])
	assert.Equal(t, "t", dl[0].Headers[ferry.HeaderOriginTopic])
	assert.Equal(t, "5000", dl[0].Headers[ferry.HeaderOriginOffset])
	for body, as := range log.attempts {
		if body != "m5000" {
			require.Equal(t, []int{1}, as, "%s handled more than once", body)
		}
	}
}

// TestRetryRebalanceRedeliversOnlyInFlight: with a tenth of the messages
// failing their first attempt, two members joining while 20,000 flow
// hand over their queues without handling anything twice (before, a
// rebalance redelivered everything after a message waiting out its
// backoff: 5,473 of 20,000 handled twice), and every retry arrives as
// attempt 2, whoever owns it then.
func TestRetryRebalanceRedeliversOnlyInFlight(t *testing.T) {
	b := newTopic(t, 8)
	log := newAttemptLog(systemClock{}, func(body string, attempt int) error {
		n, _ := strconv.Atoi(body[1:])
		if n%10 == 0 && attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
	opts := []ferry.ConsumerOption{ferry.WithRetry(3, 20*time.Millisecond), ferry.WithConcurrency(4)}
	startConsumer(t, b, "g", log.handler(), append(opts, ferry.WithMemberID("a"))...)
	p, err := b.NewProducer()
	require.NoError(t, err)
	const n = 20_000
	for i := range n {
		_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Key: strconv.Itoa(i % 97), Body: []byte("m" + strconv.Itoa(i))})
		require.NoError(t, err)
		switch i {
		case n / 3:
			startConsumer(t, b, "g", log.handler(), append(opts, ferry.WithMemberID("b"))...)
		case 2 * n / 3:
			startConsumer(t, b, "g", log.handler(), append(opts, ferry.WithMemberID("c"))...)
		}
	}
	ferrytest.WaitFor(t, 0, "every message and retry", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		if len(log.attempts) < n {
			return false
		}
		for body, as := range log.attempts {
			k, _ := strconv.Atoi(body[1:])
			if k%10 == 0 && len(as) < 2 {
				return false
			}
		}
		return true
	}, log.wake)
	log.mu.Lock()
	defer log.mu.Unlock()
	twice := 0
	for body, as := range log.attempts {
		k, _ := strconv.Atoi(body[1:])
		want := []int{1}
		if k%10 == 0 {
			want = []int{1, 2}
		}
		if !assert.ObjectsAreEqual(want, as) {
			twice++
			if twice <= 5 {
				t.Errorf("%s: attempts %v by %v, want %v", body, as, log.members[body], want)
			}
		}
	}
	assert.Zero(t, twice, "messages handled other than once per attempt")
}

// TestRetryAttemptSurvivesRestart: a message that failed once waits in
// the retry topic of a filestore across a restart and comes back as
// attempt 2, after its backoff and not before.
func TestRetryAttemptSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := ferrytest.NewFakeClock(start)
	open := func() (*ferry.Broker, *filestore.Store) {
		s, err := filestore.Open(dir)
		require.NoError(t, err)
		b, err := ferry.NewBroker(ferry.WithStorage(s), ferry.WithCursorStore(s), ferry.WithClock(clock))
		require.NoError(t, err)
		return b, s
	}
	b, s := open()
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "t", Queues: 2}))
	log := newAttemptLog(clock, func(_ string, attempt int) error {
		if attempt < 3 {
			return fmt.Errorf("attempt %d fails", attempt)
		}
		return nil
	})
	opts := []ferry.ConsumerOption{ferry.WithRetry(5, time.Hour), ferry.WithMaxRetryBackoff(24 * time.Hour), ferry.WithMemberID("m")}
	c, err := b.NewConsumer("g", "t", log.handler(), opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	produce(t, b, "t", "x", 3, 3)
	ferrytest.WaitFor(t, 0, "first attempts", func() bool { return log.distinct() == 3 }, log.wake)
	ferrytest.WaitFor(t, 0, "the retries written", func() bool { return c.Stats().Retried == 3 }, nil)
	require.NoError(t, c.Close())
	require.NoError(t, b.Close())
	require.NoError(t, s.Close())

	b, s = open()
	defer func() { _ = b.Close(); _ = s.Close() }()
	c, err = b.NewConsumer("g", "t", log.handler(), opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	defer c.Close()
	runClock(t, clock, "the third attempts", func() bool {
		for _, body := range []string{"x0", "x1", "x2"} {
			if len(log.seen(body)) < 3 {
				return false
			}
		}
		return true
	}, log.wake)
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, body := range []string{"x0", "x1", "x2"} {
		assert.Equal(t, []int{1, 2, 3}, log.attempts[body], body)
		at := log.at[body]
		assert.GreaterOrEqual(t, at[1].Sub(at[0]), time.Hour, "%s: attempt 2 early", body)
		assert.GreaterOrEqual(t, at[2].Sub(at[1]), 2*time.Hour, "%s: attempt 3 early", body)
	}
}

// TestRetryAfterAndPermanent: RetryAfter sets this message's wait
// instead of the backoff; Permanent sends it to the dead-letter topic at
// once, without a retry.
func TestRetryAfterAndPermanent(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := newTopic(t, 1, ferry.WithClock(clock))
	log := newAttemptLog(clock, func(body string, attempt int) error {
		switch {
		case body == "soon" && attempt == 1:
			return ferry.RetryAfter(errors.New("come back in ten minutes"), 10*time.Minute)
		case body == "never":
			return ferry.Permanent(errors.New("malformed"))
		}
		return nil
	})
	c := startConsumer(t, b, "g", log.handler(), ferry.WithRetry(5, 24*time.Hour))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for _, body := range []string{"soon", "never"} {
		_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Body: []byte(body)})
		require.NoError(t, err)
	}
	ferrytest.WaitFor(t, 0, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 }, nil)
	runClock(t, clock, "the second attempt", func() bool { return len(log.seen("soon")) == 2 }, log.wake)
	log.mu.Lock()
	wait := log.at["soon"][1].Sub(log.at["soon"][0])
	log.mu.Unlock()
	assert.GreaterOrEqual(t, wait, 10*time.Minute)
	assert.Less(t, wait, 24*time.Hour, "the backoff, not RetryAfter's wait")
	assert.Equal(t, []int{1}, log.seen("never"))
	assert.Equal(t, uint64(1), c.Stats().Retried)
	dl := deadLetters(t, b, "%DLQ%g")
	require.Len(t, dl, 1)
	assert.Equal(t, "never", string(dl[0].Body))
	assert.Equal(t, "1", dl[0].Headers[ferry.HeaderAttempts])
}

// TestRetryOrderedStaysInPlace: in ordered mode a failing message holds
// its queue (it must keep the order): no retry topic is made, and the
// message after it waits.
func TestRetryOrderedStaysInPlace(t *testing.T) {
	b := newTopic(t, 1)
	log := newAttemptLog(systemClock{}, func(body string, attempt int) error {
		if body == "o0" && attempt < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	startConsumer(t, b, "g", log.handler(), ferry.Ordered(), ferry.WithRetry(5, time.Millisecond))
	produce(t, b, "t", "o", 2, 1)
	ferrytest.WaitFor(t, 0, "both", func() bool { return log.distinct() == 2 }, log.wake)
	assert.Equal(t, []int{1, 2, 3}, log.seen("o0"))
	log.mu.Lock()
	assert.True(t, log.at["o1"][0].After(log.at["o0"][2]), "o1 waited for o0")
	log.mu.Unlock()
	_, ok := b.Topic(ferry.RetryTopic("g", "t"))
	assert.False(t, ok, "no retry topic in ordered mode")
}

// TestForgetGroupDeletesItsRetries: a forgotten group's retries go with
// it: a group of that name that comes back does not get them.
func TestForgetGroupDeletesItsRetries(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := newTopic(t, 1, ferry.WithClock(clock))
	log := newAttemptLog(clock, func(string, int) error { return errors.New("fails") })
	c, err := b.NewConsumer("g", "t", log.handler(), ferry.WithRetry(3, time.Minute))
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	produce(t, b, "t", "f", 1, 1)
	ferrytest.WaitFor(t, 0, "the first attempt's retry", func() bool { return c.Stats().Retried == 1 }, nil)
	require.NoError(t, c.Close())
	_, ok := b.Topic(ferry.RetryTopic("g", "t"))
	require.True(t, ok)
	require.NoError(t, b.ForgetGroup(t.Context(), "g", "t"))
	_, ok = b.Topic(ferry.RetryTopic("g", "t"))
	assert.False(t, ok, "the retry topic is gone")

	again := newAttemptLog(clock, func(string, int) error { return nil })
	startConsumer(t, b, "g", again.handler(), ferry.WithStartFrom(ferry.Latest))
	clock.Advance(time.Hour)
	produce(t, b, "t", "n", 1, 1)
	ferrytest.WaitFor(t, 0, "the new message", func() bool { return again.distinct() == 1 }, again.wake)
	assert.Empty(t, again.seen("f0"), "the forgotten group's retry came back")
}

// TestRetryNotCountedWhenGivenUp: a handler whose context the drain
// timeout cancels fails because its queue is given up, not because of the
// message: the next owner gets it at once, as attempt 1, once (it went to
// the retry topic, due after the backoff, with the attempt counted).
func TestRetryNotCountedWhenGivenUp(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := newTopic(t, 1, ferry.WithClock(clock))
	holding := make(chan struct{}, 1)
	a, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		holding <- struct{}{}
		<-ctx.Done() // until the drain timeout gives up
		return ctx.Err()
	}), ferry.WithRetry(3, time.Hour), ferry.WithDrainTimeout(10*time.Millisecond), ferry.WithConcurrency(1), ferry.WithMemberID("a"))
	require.NoError(t, err)
	require.NoError(t, a.Start(t.Context()))
	produce(t, b, "t", "x", 1, 1)
	waitFor(t, holding, "a handles x0")
	require.NoError(t, a.Close())
	assert.Zero(t, a.Stats().Retried)

	log := newAttemptLog(clock, func(string, int) error { return nil })
	startConsumer(t, b, "g", log.handler(), ferry.WithMemberID("b"))
	ferrytest.WaitFor(t, 0, "x0 at the next owner, the clock standing still", func() bool { return log.distinct() == 1 }, log.wake)
	assert.Equal(t, []int{1}, log.seen("x0"))
}
