package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

type reset struct {
	q        ferry.QueueID
	from, to int64
}

func TestConsumerCursorBehindRetentionResetsAndReports(t *testing.T) {
	cursors := ferry.NewMemoryCursorStore()
	t.Cleanup(func() { _ = cursors.Close() }) // after the consumers: their last commits go in
	b, err := ferry.NewBroker(ferry.WithCursorStore(cursors))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 10}}))
	require.NoError(t, cursors.Commit(context.Background(), "t", "g", 0, 5))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for i := range 100 { // offsets 90..99 are retained
		_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte("x" + strconv.Itoa(i))})
		require.NoError(t, err)
	}

	resets := make(chan reset, 4)
	c := newTally(10)
	cn, err := b.NewConsumer("g", "t", c.handler(), ferry.WithOnReset(func(q ferry.QueueID, from, to int64) {
		resets <- reset{q, from, to}
	}))
	require.NoError(t, err)
	require.NoError(t, cn.Start(context.Background()))
	defer cn.Close()
	assert.Equal(t, reset{ferry.QueueID{Topic: "t", Queue: 0}, 5, 90}, <-resets)
	c.waitAll(t)
	for i := 90; i < 100; i++ {
		assert.Equal(t, 1, c.Count("x"+strconv.Itoa(i)))
	}
	require.NoError(t, cn.Close())
	offs, err := cursors.Load(context.Background(), "t", "g", 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{100}, offs)
}

func TestConsumerRetryThenDeadLetter(t *testing.T) {
	b := newTopic(t, 2)
	var mu sync.Mutex
	attempts := map[string][]int{}
	boom := errors.New("boom")
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, ok := ferry.DeliveryFrom(ctx)
		require.True(t, ok)
		assert.Equal(t, "g", d.Group)
		mu.Lock()
		attempts[string(m.Body)] = append(attempts[string(m.Body)], d.Attempt)
		mu.Unlock()
		switch string(m.Body) {
		case "fail":
			return boom
		case "permanent":
			return ferry.Permanent(boom)
		case "panic":
			panic("handler exploded")
		case "flaky":
			if d.Attempt < 2 {
				return boom
			}
		}
		return nil
	})
	startConsumer(t, b, "g", h, ferry.WithRetry(3, time.Millisecond))
	p, err := b.NewProducer()
	require.NoError(t, err)
	var sent = map[string]ferry.SendResult{}
	for _, body := range []string{"ok", "fail", "permanent", "panic", "flaky"} {
		res, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Key: body, Body: []byte(body), Headers: map[string]string{"mine": "kept"}})
		require.NoError(t, err)
		sent[body] = res
	}

	dead := newTally(3)
	dlq := map[string]*ferry.EnhancedMessage{}
	var dmu sync.Mutex
	require.Eventually(t, func() bool { _, ok := b.Topic("%DLQ%g"); return ok }, 10*time.Second, time.Millisecond)
	dc, err := b.NewConsumer("reader", "%DLQ%g", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		dmu.Lock()
		dlq[string(m.Body)] = m
		dmu.Unlock()
		dead.add(string(m.Body))
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, dc.Start(context.Background()))
	defer dc.Close()
	dead.waitAll(t)

	dmu.Lock()
	defer dmu.Unlock()
	require.Len(t, dlq, 3)
	for body, wantAttempts := range map[string]int{"fail": 3, "permanent": 1, "panic": 3} {
		m := dlq[body]
		require.NotNil(t, m, body)
		res := sent[body]
		assert.Equal(t, "t", m.Headers[ferry.HeaderOriginTopic])
		assert.Equal(t, strconv.Itoa(res.Queue.Queue), m.Headers[ferry.HeaderOriginQueue])
		assert.Equal(t, strconv.FormatInt(res.Offset, 10), m.Headers[ferry.HeaderOriginOffset])
		assert.Equal(t, res.ID.String(), m.Headers[ferry.HeaderOriginID])
		assert.Equal(t, "g", m.Headers[ferry.HeaderGroup])
		assert.Equal(t, strconv.Itoa(wantAttempts), m.Headers[ferry.HeaderAttempts], body)
		assert.Equal(t, "kept", m.Headers["mine"])
		assert.Equal(t, body, m.Key)
		if body == "panic" {
			assert.Contains(t, m.Headers[ferry.HeaderError], "handler exploded")
		} else {
			assert.Contains(t, m.Headers[ferry.HeaderError], "boom")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{1, 2, 3}, attempts["fail"])
	assert.Equal(t, []int{1}, attempts["permanent"])
	assert.Equal(t, []int{1, 2, 3}, attempts["panic"])
	assert.Equal(t, []int{1, 2}, attempts["flaky"])
	assert.Equal(t, []int{1}, attempts["ok"])
}

func TestConsumerRetryDoesNotBlockOtherQueues(t *testing.T) {
	b := newTopic(t, 2)
	release := make(chan struct{})
	c := newTally(50)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		if string(m.Body) == "stuck" {
			select {
			case <-release:
				return nil
			default:
				return errors.New("not yet")
			}
		}
		c.add(string(m.Body))
		return nil
	})
	// Many attempts, long enough backoff: "stuck" keeps failing while the
	// rest of the topic, its own queue included, goes on.
	startConsumer(t, b, "g", h, ferry.WithRetry(1000, 5*time.Millisecond), ferry.WithConcurrency(2))
	p, err := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
	require.NoError(t, err)
	_, err = p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte("stuck")})
	require.NoError(t, err)
	produce(t, b, "t", "x", 50, 10)
	c.waitAll(t)
	close(release)
}

func TestConsumerOrderedRetryHoldsItsQueue(t *testing.T) {
	b := newTopic(t, 1)
	var mu sync.Mutex
	var order []string
	done := make(chan struct{})
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		mu.Lock()
		defer mu.Unlock()
		order = append(order, string(m.Body)+"#"+strconv.Itoa(d.Attempt))
		if string(m.Body) == "a" && d.Attempt < 3 {
			return errors.New("again")
		}
		if string(m.Body) == "c" {
			close(done)
		}
		return nil
	})
	startConsumer(t, b, "g", h, ferry.Ordered(), ferry.WithRetry(5, time.Millisecond))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for _, s := range []string{"a", "b", "c"} {
		_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte(s)})
		require.NoError(t, err)
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"a#1", "a#2", "a#3", "b#1", "c#1"}, order)
}

// An ordered message that keeps failing holds its queue only while the
// member owns it: Close (a release) abandons it at once instead of waiting
// out the backoff and the drain timeout, and the next owner attempts it
// again from its first attempt.
func TestConsumerOrderedReleaseDoesNotWaitOutRetries(t *testing.T) {
	b := newTopic(t, 1)
	failing := make(chan int, 64)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		select {
		case failing <- d.Attempt:
		default:
		}
		return errors.New("not yet")
	})
	c, err := b.NewConsumer("g", "t", h, ferry.Ordered(), ferry.WithConcurrency(1),
		ferry.WithRetry(1000, time.Hour), ferry.WithDrainTimeout(2*time.Minute)) // longer than the watchdog
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	produce(t, b, "t", "x", 1, 1)
	require.Equal(t, 1, <-failing)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed: // neither the backoff nor the drain timeout was waited out
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("watchdog: Close waited out the retry backoff")
	}

	again := newTally(1)
	startConsumer(t, b, "g", again.handler(), ferry.Ordered())
	again.waitAll(t)
	assert.Equal(t, 1, again.Count("x0"), "the failed message goes to the next owner")
}

// TestConsumerConcurrentReleaseDoesNotWaitOutRetries: in concurrent mode
// a failed message waits out its backoff in the group's retry topic, not
// in its queue: Close waits for neither the backoff nor the drain
// timeout, and the next consumer of the group gets the message when its
// backoff ends, as attempt 2 (the count survives the hand-over).
func TestConsumerConcurrentReleaseDoesNotWaitOutRetries(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := newTopic(t, 2, ferry.WithClock(clock))
	failing := make(chan int, 64)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		select {
		case failing <- d.Attempt:
		default:
		}
		return errors.New("not yet")
	})
	opts := []ferry.ConsumerOption{ferry.WithConcurrency(4), ferry.WithRetry(1000, time.Hour), ferry.WithDrainTimeout(2 * time.Minute)} // longer than the watchdog
	c, err := b.NewConsumer("g", "t", h, opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	produce(t, b, "t", "x", 2, 1)
	require.Equal(t, 1, <-failing)
	require.Equal(t, 1, <-failing)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed: // neither the backoff nor the drain timeout was waited out
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("watchdog: Close waited out the retry backoff")
	}

	var mu sync.Mutex
	attempts := map[string]int{}
	got := make(chan struct{}, 2)
	startConsumer(t, b, "g", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		mu.Lock()
		attempts[string(m.Body)] = d.Attempt
		mu.Unlock()
		got <- struct{}{}
		return nil
	}), opts...)
	require.NoError(t, clock.WaitForTimers(t.Context(), 1)) // the retries' delay level waits on the clock
	clock.Advance(time.Hour)
	for range 2 {
		waitFor(t, got, "a retry")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"x0": 2, "x1": 2}, attempts, "the next consumer gets each as attempt 2")
}

// WithMaxRetryBackoff caps the doubling: with the cap equal to the first
// backoff, every retry waits the same, so many retries of one ordered
// message fit where a doubling backoff would take hours.
func TestConsumerMaxRetryBackoffCapsTheWait(t *testing.T) {
	const attempts = 40 // uncapped from 1ms, the 40th wait alone would be 2^39 ms
	b := newTopic(t, 1)
	done := make(chan struct{})
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		if d.Attempt < attempts {
			return errors.New("again")
		}
		close(done)
		return nil
	})
	startConsumer(t, b, "g", h, ferry.Ordered(), ferry.WithRetry(attempts, time.Millisecond),
		ferry.WithMaxRetryBackoff(time.Millisecond))
	produce(t, b, "t", "x", 1, 1)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("watchdog: the retries did not keep a constant backoff")
	}
}

func TestConsumerCloseDrainsInFlight(t *testing.T) {
	cursors := ferry.NewMemoryCursorStore()
	t.Cleanup(func() { _ = cursors.Close() }) // after the consumers: their last commits go in
	b := newTopic(t, 1, ferry.WithCursorStore(cursors))
	entered := make(chan struct{})
	proceed := make(chan struct{})
	var handled sync.WaitGroup
	handled.Add(1)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		if string(m.Body) == "x0" {
			close(entered)
			<-proceed
			handled.Done()
		}
		return nil
	})
	c, err := b.NewConsumer("g", "t", h, ferry.WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	produce(t, b, "t", "x", 1, 1)
	<-entered
	closed := make(chan error)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a handler was in flight")
	default:
	}
	close(proceed)
	require.NoError(t, <-closed)
	handled.Wait()
	offs, err := cursors.Load(context.Background(), "t", "g", 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{1}, offs, "the drained message is committed")
}

func TestConsumerDrainTimeoutCancelsAndRedelivers(t *testing.T) {
	b := newTopic(t, 1)
	entered := make(chan struct{}, 1)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		entered <- struct{}{}
		<-ctx.Done() // honours cancellation only
		return ctx.Err()
	})
	c, err := b.NewConsumer("g", "t", h, ferry.WithDrainTimeout(0), ferry.WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	produce(t, b, "t", "x", 1, 1)
	<-entered
	require.NoError(t, c.Close())

	again := newTally(1)
	startConsumer(t, b, "g", again.handler())
	again.waitAll(t)
	assert.Equal(t, 1, again.Count("x0"), "the abandoned message goes to the next owner")
}

func TestBrokerCloseClosesConsumers(t *testing.T) {
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: 2}))
	c := newTally(10)
	cn, err := b.NewConsumer("g", "t", c.handler())
	require.NoError(t, err)
	require.NoError(t, cn.Start(context.Background()))
	produce(t, b, "t", "x", 10, 2)
	c.waitAll(t)
	require.NoError(t, b.Close())
	require.ErrorIs(t, cn.Start(context.Background()), ferry.ErrClosed)
	require.NoError(t, cn.Close())
	_, err = b.NewConsumer("g", "t", c.handler())
	require.ErrorIs(t, err, ferry.ErrClosed)
}

func TestConsumerCloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: 4}))
	c := newTally(500)
	var cs []*ferry.Consumer
	for i, opts := range [][]ferry.ConsumerOption{
		nil, {ferry.Ordered()}, {ferry.Broadcast()}, {ferry.WithRetry(100, time.Hour)},
	} {
		cn, err := b.NewConsumer("g"+strconv.Itoa(i), "t", c.handler(), opts...)
		require.NoError(t, err)
		require.NoError(t, cn.Start(context.Background()))
		cs = append(cs, cn)
	}
	pc, err := b.NewPullConsumer("pull", "t")
	require.NoError(t, err)
	require.NoError(t, pc.Start(context.Background()))
	produce(t, b, "t", "x", 500, 10)
	c.waitAll(t)
	for _, cn := range cs {
		require.NoError(t, cn.Close())
	}
	require.NoError(t, pc.Close())
	require.NoError(t, b.Close())
}

func TestConsumerFallingBehindRetentionWhileConsumingResets(t *testing.T) {
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 5}}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	send := func(i int) {
		_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte("x" + strconv.Itoa(i))})
		require.NoError(t, err)
	}
	send(0)
	entered := make(chan struct{})
	gate := make(chan struct{})
	resets := make(chan reset, 4)
	c := newTally(0)
	all := make(chan struct{})
	h := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		if m.Offset == 0 {
			close(entered)
			<-gate
		}
		c.add(string(m.Body))
		if m.Offset == 49 {
			close(all)
		}
		return nil
	})
	cn, err := b.NewConsumer("g", "t", h, ferry.WithBuffer(1, 1<<20), ferry.WithConcurrency(1),
		ferry.WithOnReset(func(q ferry.QueueID, from, to int64) {
			select {
			case resets <- reset{q, from, to}: // WithOnReset must not block
			default:
			}
		}))
	require.NoError(t, err)
	require.NoError(t, cn.Start(context.Background()))
	defer cn.Close()
	<-entered // the consumer is stuck on offset 0 with a full buffer
	for i := 1; i < 50; i++ {
		send(i) // retention keeps only 45..49
	}
	close(gate)
	// The fetcher may find its next offset gone while the sends go on, or
	// only after the gate opens; either way it moves forward and says so.
	r := <-resets
	assert.Equal(t, ferry.QueueID{Topic: "t", Queue: 0}, r.q)
	assert.Less(t, r.from, r.to)
	assert.LessOrEqual(t, r.to, int64(45))
	<-all
	for i := 45; i < 50; i++ {
		assert.Equal(t, 1, c.Count("x"+strconv.Itoa(i)))
	}
}
