package ferry_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// Users cannot create, write to, grow or delete system topics (before,
// CreateTopic("%DELAY%0", MaxMessages 4) was taken and used as the delay
// level, a Send to it was stored and dropped, a forced DeleteTopic of it
// broke every later delay with "closed"); they can consume a dead-letter
// topic, and delays keep working after every refused attempt.
func TestSystemTopicsAreReserved(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 1)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	// Make the level exist: a delayed message.
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("first"), DeliverAt: time.Now().Add(20 * time.Millisecond)})
	require.NoError(t, err)
	for _, name := range []string{"%DELAY%0", "%DELAY%7", "%RETRY%g%%t", "%DLQ%g", "%anything"} {
		assert.True(t, ferry.IsSystemTopic(name), name)
		assert.ErrorIs(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: name, Queues: 1, Retention: ferry.Retention{MaxMessages: 4}}), ferry.ErrInvalidTopic, "create %s", name)
		_, err := p.Send(ctx, &ferry.Message{Topic: name, Body: []byte("x")})
		assert.ErrorIs(t, err, ferry.ErrInvalidTopic, "send to %s", name)
		_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "t", Body: []byte("ok")}, {Topic: name, Body: []byte("x")}})
		assert.ErrorIs(t, err, ferry.ErrInvalidTopic, "a batch with a message to %s", name)
		assert.ErrorIs(t, b.DeleteTopic(ctx, name, ferry.ForceDelete()), ferry.ErrInvalidTopic, "delete %s", name)
		assert.ErrorIs(t, b.AddQueues(ctx, name, 4), ferry.ErrInvalidTopic, "grow %s", name)
	}
	assert.False(t, ferry.IsSystemTopic("orders%eu"), "a '%' inside a user's name is the user's")
	meta, ok := b.Topic("%DELAY%0")
	require.True(t, ok, "the level is still there")
	assert.EqualValues(t, ferry.Unlimited, meta.Retention.MaxMessages, "and keeps its retention")

	// The batch with a refused message wrote nothing; the delays work.
	got := make(chan string, 4)
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		got <- string(m.Body)
		if string(m.Body) == "poison" {
			return ferry.Permanent(errors.New("poison"))
		}
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("second"), DeliverAt: time.Now().Add(10 * time.Millisecond)})
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("poison")})
	require.NoError(t, err)
	seen := map[string]bool{}
	for len(seen) < 3 {
		select {
		case body := <-got:
			seen[body] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("handled %v; want first, second and poison", seen)
		}
	}
	assert.False(t, seen["ok"], "the refused batch wrote nothing")

	// A reader consumes the dead letters.
	dlq, err := ferry.DeadLetterTopic("g")
	require.NoError(t, err)
	dead := make(chan string, 1)
	r, err := b.NewConsumer("reader", dlq, ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		dead <- string(m.Body)
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	defer r.Close()
	select {
	case body := <-dead:
		assert.Equal(t, "poison", body)
	case <-time.After(10 * time.Second):
		t.Fatal("the dead letter was not consumed")
	}
	meta, ok = b.Topic(dlq)
	require.True(t, ok)
	assert.Equal(t, ferry.Block, meta.Retention.Overflow, "a dead-letter topic never drops")
	assert.EqualValues(t, ferry.Unlimited, meta.Retention.MaxBytes)
}

// The names the library derives from a (group, topic) pair are
// injective: before, RetryTopic("a%b", "c") == RetryTopic("a", "b%c"),
// and each group handled the other's retries under the wrong topic.
func TestSystemNamesAreInjective(t *testing.T) {
	pairs := [][2]string{
		{"a%b", "c"}, {"a", "b%c"}, {"a", "b%%c"}, {"a%", "b%c"}, {"a%25", "c"}, {"a%", "25c"},
		{"a b", "c"}, {"a%20b", "c"}, {"a_b", "c"}, {"a", "_b"}, {"a.b", "c"}, {"a", ".b.c"},
		{"é", "c"}, {"%C3%A9", "c"}, {"\x00", "c"}, {"a", "c"}, {"a%%", "c"}, {"a", "%%c"},
	}
	seen := map[string][2]string{}
	dead := map[string]string{}
	for _, p := range pairs {
		name, err := ferry.RetryTopic(p[0], p[1])
		require.NoError(t, err, "%q", p)
		require.NoError(t, ferry.ValidateTopicName(name), "%q -> %q", p, name)
		require.True(t, ferry.IsSystemTopic(name))
		if o, dup := seen[name]; dup {
			t.Errorf("RetryTopic(%q, %q) == RetryTopic(%q, %q) == %q", p[0], p[1], o[0], o[1], name)
		}
		seen[name] = p
		dl, err := ferry.DeadLetterTopic(p[0])
		require.NoError(t, err)
		require.NoError(t, ferry.ValidateTopicName(dl))
		if o, dup := dead[dl]; dup && o != p[0] {
			t.Errorf("DeadLetterTopic(%q) == DeadLetterTopic(%q) == %q", p[0], o, dl)
		}
		dead[dl] = p[0]
	}
	r, _ := ferry.RetryTopic("billing-svc_1", "orders.eu")
	assert.Equal(t, "%RETRY%billing-svc_1%%orders.eu", r, "plain names stay readable")
	_, err := ferry.RetryTopic(strings.Repeat("g", 255), "t")
	assert.ErrorIs(t, err, ferry.ErrInvalidOption, "too long for a topic name: refused, not hashed")
	_, err = ferry.DeadLetterTopic(strings.Repeat("%", 100))
	assert.ErrorIs(t, err, ferry.ErrInvalidOption)

	// End to end: the two groups of the old collision keep their retries
	// apart.
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "c", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "b%c", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	var mu sync.Mutex
	handled := map[string][]string{} // group: "topic/body/attempt"
	done := make(chan struct{}, 4)
	for _, gt := range [][2]string{{"a%b", "c"}, {"a", "b%c"}} {
		group, topic := gt[0], gt[1]
		c, err := b.NewConsumer(group, topic, ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			d, _ := ferry.DeliveryFrom(ctx)
			mu.Lock()
			handled[group] = append(handled[group], m.Topic+"/"+string(m.Body)+"/"+string(rune('0'+d.Attempt)))
			mu.Unlock()
			if d.Attempt == 1 {
				return errors.New("once")
			}
			done <- struct{}{}
			return nil
		}), ferry.WithRetry(3, time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		defer c.Close()
		_, err = p.Send(ctx, &ferry.Message{Topic: topic, Body: []byte(group)})
		require.NoError(t, err)
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("retries not handled: %v", handled)
		}
	}
	for _, gt := range [][2]string{{"a%b", "c"}, {"a", "b%c"}} {
		name, _ := ferry.RetryTopic(gt[0], gt[1])
		meta, ok := b.Topic(name)
		require.True(t, ok, name)
		assert.Equal(t, ferry.Block, meta.Retention.Overflow, "a retry topic never drops by retention")
		assert.EqualValues(t, ferry.Unlimited, meta.Retention.MaxBytes)
		assert.EqualValues(t, ferry.Unlimited, meta.Retention.MaxMessages)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"c/a%b/1", "c/a%b/2"}, handled["a%b"])
	assert.Equal(t, []string{"b%c/a/1", "b%c/a/2"}, handled["a"])
}

// A due time no due time can hold is refused, never moved: before, a
// DeliverAt in 2300 overflowed the header's Unix nanoseconds (read back
// as 1715) and was handled at once, and RetryAfter(err, MaxInt64) came
// back after five years. A retry due too late goes to the dead-letter
// topic, saying why.
func TestDueTimesBeyondRangeAreRefused(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 1)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	late := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x"), DeliverAt: late})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "t", Body: []byte("ok")}, {Topic: "t", Body: []byte("x"), DeliverAt: late}})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("edge"), DeliverAt: ferry.MaxDeliverAt})
	require.NoError(t, err, "the latest due time is taken")
	rq, err := b.Queue("t", 0)
	require.NoError(t, err)
	_, next := rq.Offsets()
	assert.Zero(t, next, "nothing refused was written")

	calls := make(chan int, 4)
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		calls <- d.Attempt
		return ferry.RetryAfter(errors.New("come back in 292 years"), math.MaxInt64)
	}), ferry.WithRetry(5, time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("y")})
	require.NoError(t, err)
	dlq, _ := ferry.DeadLetterTopic("g")
	waitForDeadLetter := func() *ferry.EnhancedMessage {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if q, err := b.Queue(dlq, 0); err == nil {
				if _, n := q.Offsets(); n > 0 {
					buf := make([]*ferry.EnhancedMessage, 1)
					_, err := q.Read(ctx, 0, buf)
					require.NoError(t, err)
					return buf[0]
				}
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatal("no dead letter")
		return nil
	}
	m := waitForDeadLetter()
	assert.Equal(t, "y", string(m.Body))
	assert.Contains(t, m.Headers[ferry.HeaderError], "not retried")
	assert.Equal(t, 1, <-calls)
	select {
	case a := <-calls:
		t.Fatalf("attempt %d: retried early", a)
	case <-time.After(50 * time.Millisecond):
	}
}

// A target that cannot take its delayed messages waits alone: before, a
// delayed message due for a full Block topic stopped every later delay
// and every retry of the broker.
func TestFullTargetStallsNoOtherDelay(t *testing.T) {
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "full", Queues: 1, Retention: ferry.Retention{MaxMessages: 1, Overflow: ferry.Block}}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "free", Queues: 2}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "work", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "full", Body: []byte("fills it")})
	require.NoError(t, err)
	// Due far enough ahead that a loaded machine still places them in a
	// level: one due already at its Send goes straight to the full topic
	// and blocks like any Send to it.
	due := time.Now().Add(300 * time.Millisecond)
	for i := range 3 {
		_, err = p.Send(ctx, &ferry.Message{Topic: "full", Body: []byte{byte('a' + i)}, DeliverAt: due})
		require.NoError(t, err)
	}
	time.Sleep(time.Until(due) + 50*time.Millisecond) // they are due, and stuck

	got := make(chan string, 64)
	c, err := b.NewConsumer("g", "free", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		got <- string(m.Body)
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	retried := make(chan int, 4)
	w, err := b.NewConsumer("w", "work", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		retried <- d.Attempt
		if d.Attempt == 1 {
			return errors.New("once")
		}
		return nil
	}), ferry.WithRetry(3, 10*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	defer w.Close()
	const n = 20
	for i := range n {
		_, err = p.Send(ctx, &ferry.Message{Topic: "free", Key: string(rune('k' + i%3)), Body: []byte{byte(i)}, DeliverAt: time.Now().Add(10 * time.Millisecond)})
		require.NoError(t, err)
	}
	_, err = p.Send(ctx, &ferry.Message{Topic: "work", Body: []byte("retry me")})
	require.NoError(t, err)
	deadline := time.After(10 * time.Second)
	for seen := 0; seen < n; seen++ {
		select {
		case <-got:
		case <-deadline:
			t.Fatalf("%d of %d delayed messages for a free topic arrived while another topic is full", seen, n)
		}
	}
	for _, want := range []int{1, 2} {
		select {
		case a := <-retried:
			assert.Equal(t, want, a)
		case <-deadline:
			t.Fatalf("attempt %d of a retry did not arrive while another topic is full", want)
		}
	}

	// Once the full topic has room, its delayed messages arrive, in order.
	full := make(chan string, 8)
	f, err := b.NewConsumer("f", "full", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		full <- string(m.Body)
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, f.Start(ctx))
	defer f.Close()
	var order []string
	for len(order) < 4 {
		select {
		case body := <-full:
			order = append(order, body)
		case <-deadline:
			t.Fatalf("the full topic's delayed messages: got %v", order)
		}
	}
	assert.Equal(t, []string{"fills it", "a", "b", "c"}, order)
}

// Delays and retries do not die with the broker that placed them: b2,
// started before any delay level existed, moves the levels b1 made once
// b1 closes, and its member of the group gets the retries b1's member
// wrote (before: 0 of 20 delayed messages and 0 of 10 retries arrived).
func TestDelaysOutliveTheirBroker(t *testing.T) {
	ctx := context.Background()
	storage, cursors, coord := ferry.NewMemoryStorage(), ferry.NewMemoryCursorStore(), ferry.NewMemoryCoordinator()
	defer storage.Close()
	defer coord.Close()
	open := func() *ferry.Broker {
		b, err := ferry.NewBroker(ferry.WithStorage(storage), ferry.WithCursorStore(cursors), ferry.WithCoordinator(coord))
		require.NoError(t, err)
		return b
	}
	b2 := open()
	defer b2.Close()
	b1 := open()
	require.NoError(t, b1.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 2}))
	require.NoError(t, b1.CreateTopic(ctx, ferry.TopicMeta{Name: "work", Queues: 2}))

	var mu sync.Mutex
	delayed := map[string]bool{}
	attempts := map[string][]int{}
	wake := make(chan struct{}, 1)
	note := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	handler := func(fail bool) ferry.Handler {
		return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			d, _ := ferry.DeliveryFrom(ctx)
			mu.Lock()
			attempts[string(m.Body)] = append(attempts[string(m.Body)], d.Attempt)
			mu.Unlock()
			note()
			if fail && d.Attempt == 1 {
				return errors.New("once")
			}
			return nil
		})
	}
	w1, err := b1.NewConsumer("g", "work", handler(true), ferry.WithRetry(3, 300*time.Millisecond), ferry.WithMemberID("w1"))
	require.NoError(t, err)
	require.NoError(t, w1.Start(ctx))
	p, err := b1.NewProducer()
	require.NoError(t, err)
	for i := range 20 {
		_, err := p.Send(ctx, &ferry.Message{Topic: "t", Key: strconv.Itoa(i), Body: []byte("d" + strconv.Itoa(i)), DeliverAt: time.Now().Add(300 * time.Millisecond)})
		require.NoError(t, err)
	}
	for i := range 10 {
		_, err := p.Send(ctx, &ferry.Message{Topic: "work", Key: strconv.Itoa(i), Body: []byte("r" + strconv.Itoa(i))})
		require.NoError(t, err)
	}
	ferrytest.WaitFor(t, 0, "every first attempt on b1", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == 10
	}, wake)
	require.NoError(t, p.Close())
	require.NoError(t, w1.Close())
	require.NoError(t, b1.Close())

	c, err := b2.NewConsumer("d", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		mu.Lock()
		delayed[string(m.Body)] = true
		mu.Unlock()
		note()
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	w2, err := b2.NewConsumer("g", "work", handler(true), ferry.WithRetry(3, 300*time.Millisecond), ferry.WithMemberID("w2"))
	require.NoError(t, err)
	require.NoError(t, w2.Start(ctx))
	defer w2.Close()
	ferrytest.WaitFor(t, 20*time.Second, "the delayed messages and retries b1 placed, through b2", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(delayed) < 20 {
			return false
		}
		for i := range 10 {
			if len(attempts["r"+strconv.Itoa(i)]) < 2 {
				return false
			}
		}
		return true
	}, wake)
	mu.Lock()
	defer mu.Unlock()
	for i := range 10 {
		assert.Equal(t, []int{1, 2}, attempts["r"+strconv.Itoa(i)], "r%d", i)
	}
}
