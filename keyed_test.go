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
)

// keyLog records OrderedByKey handlings: per key, the offsets handled
// successfully in order, and whether two handlings of one key ever
// overlapped.
type keyLog struct {
	mu       sync.Mutex
	inside   map[string]int
	done     map[string][]int64
	overlaps []string
	maxKeys  int // the most keys inside at once
	wake     chan struct{}
}

func newKeyLog() *keyLog {
	return &keyLog{inside: map[string]int{}, done: map[string][]int64{}, wake: make(chan struct{}, 1)}
}

func (l *keyLog) enter(m *ferry.EnhancedMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inside[m.Key] > 0 {
		l.overlaps = append(l.overlaps, fmt.Sprintf("key %s offset %d entered with another of its key inside", m.Key, m.Offset))
	}
	l.inside[m.Key]++
	l.maxKeys = max(l.maxKeys, len(l.inside))
}

func (l *keyLog) leave(m *ferry.EnhancedMessage, ok bool) {
	l.mu.Lock()
	if l.inside[m.Key]--; l.inside[m.Key] == 0 {
		delete(l.inside, m.Key)
	}
	if ok {
		l.done[m.Key] = append(l.done[m.Key], m.Offset)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *keyLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, offs := range l.done {
		n += len(offs)
	}
	return n
}

// checkOrder asserts that each key's offsets were handled once each, in
// increasing order, and that no two handlings of a key overlapped.
func (l *keyLog) checkOrder(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Empty(t, l.overlaps, "handlings of one key overlapped")
	for key, offs := range l.done {
		for i := 1; i < len(offs); i++ {
			if offs[i] <= offs[i-1] {
				t.Errorf("key %s: offset %d handled after %d", key, offs[i], offs[i-1])
				break
			}
		}
	}
}

// OrderedByKey: one queue, many keys, several workers: each key's
// messages in offset order, never two of a key at once, and keys in
// parallel (the first handling waits until a handling of another key
// runs beside it).
func TestOrderedByKeyOrderAndParallelism(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 1)
	const n, keys = 2000, 16
	ferrytest.Produce(t, b, "t", "m", n, keys)
	log := newKeyLog()
	beside := make(chan struct{})
	var once sync.Once
	first := true
	var firstMu sync.Mutex
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		log.enter(m)
		firstMu.Lock()
		isFirst := first
		first = false
		firstMu.Unlock()
		if isFirst {
			select {
			case <-beside: // another key runs in parallel
			case <-time.After(10 * time.Second):
				t.Error("no handling of another key ran beside the first one")
			}
		} else {
			once.Do(func() { close(beside) })
		}
		log.leave(m, true)
		return nil
	}), ferry.OrderedByKey(), ferry.WithConcurrency(4))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	ferrytest.WaitFor(t, 0, "every message", func() bool { return log.total() >= n }, log.wake)
	log.checkOrder(t)
	assert.Equal(t, n, log.total(), "each message once")
	assert.Len(t, log.done, keys)
	assert.GreaterOrEqual(t, log.maxKeys, 2, "keys in parallel")
}

// A failing message holds only its key: its key's later messages wait
// for its retries, every other key flows on meanwhile.
func TestOrderedByKeyFailureHoldsOnlyItsKey(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 1)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for i := range 40 {
		key := "k" + strconv.Itoa(i%4) // offsets 0, 4, 8… are key k0
		_, err := p.Send(ctx, &ferry.Message{Topic: "t", Key: key, Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	log := newKeyLog()
	release := make(chan struct{})
	others := make(chan struct{})
	var attempts []int
	var mu sync.Mutex
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		log.enter(m)
		if m.Offset == 0 {
			d, _ := ferry.DeliveryFrom(ctx)
			mu.Lock()
			attempts = append(attempts, d.Attempt)
			mu.Unlock()
			if d.Attempt == 1 {
				log.leave(m, false)
				return errors.New("not yet")
			}
			<-release // attempt 2 waits until the other keys are done
		}
		log.leave(m, true)
		if log.total() == 30 { // every message of k1, k2, k3
			close(others)
		}
		return nil
	}), ferry.OrderedByKey(), ferry.WithConcurrency(2), ferry.WithRetry(5, 5*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	select {
	case <-others:
	case <-time.After(10 * time.Second):
		t.Fatalf("the other keys did not flow while k0's first message was retried: %d handled", log.total())
	}
	log.mu.Lock()
	assert.Empty(t, log.done["k0"], "k0's later messages wait behind its first")
	log.mu.Unlock()
	close(release)
	ferrytest.WaitFor(t, 0, "every message", func() bool { return log.total() >= 40 }, log.wake)
	log.checkOrder(t)
	mu.Lock()
	assert.Equal(t, []int{1, 2}, attempts)
	mu.Unlock()
	log.mu.Lock()
	assert.Equal(t, int64(0), log.done["k0"][0], "k0 from its first message on")
	log.mu.Unlock()
}

// Per-key order survives hand-overs: members join and leave while keyed
// messages flow; each key's messages are handled in offset order, each
// once (the releases drain fully), whoever holds the queue.
func TestOrderedByKeyAcrossHandOvers(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 4)
	log := newKeyLog()
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		log.enter(m)
		log.leave(m, true)
		return nil
	})
	start := func(id string) *ferry.Consumer {
		c, err := b.NewConsumer("g", "t", h, ferry.OrderedByKey(), ferry.WithConcurrency(3), ferry.WithMemberID(id))
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		return c
	}
	live := []*ferry.Consumer{start("m0")}
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	const batches, per = 40, 25
	for i := range batches {
		msgs := make([]*ferry.Message, per)
		for j := range msgs {
			k := i*per + j
			msgs[j] = &ferry.Message{Topic: "t", Key: "k" + strconv.Itoa(k%13), Body: []byte(strconv.Itoa(k))}
		}
		_, err := p.SendBatch(ctx, msgs)
		require.NoError(t, err)
		if i%4 == 3 && len(live) > 1 {
			require.NoError(t, live[0].Close())
			live = live[1:]
		} else {
			live = append(live, start("m"+strconv.Itoa(i+1)))
		}
	}
	ferrytest.WaitFor(t, 0, "every message", func() bool { return log.total() >= batches*per }, log.wake)
	for _, c := range live {
		require.NoError(t, c.Close())
	}
	log.checkOrder(t)
	assert.Equal(t, batches*per, log.total(), "each message once")
}

func TestOrderedByKeyOptions(t *testing.T) {
	b := newTopic(t, 1)
	_, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }), ferry.Ordered(), ferry.OrderedByKey())
	assert.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// A Seek of an OrderedByKey consumer while keys hold waiting messages
// returns (their messages, not started, are dropped with the buffered
// rest) and the keys start again from the new position, in order.
func TestOrderedByKeySeek(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 1)
	const n = 300
	ferrytest.Produce(t, b, "t", "m", n, 3)
	log := newKeyLog()
	slow := make(chan struct{})
	var once sync.Once
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		log.enter(m)
		if m.Offset == 0 {
			<-slow // key 0 holds its waiting messages meanwhile
		}
		log.leave(m, true)
		return nil
	}), ferry.OrderedByKey(), ferry.WithConcurrency(2))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	ferrytest.WaitFor(t, 0, "the other keys' first messages", func() bool { return log.total() >= 2 }, log.wake)
	sought := make(chan error, 1)
	go func() { sought <- c.Seek(ctx, ferry.ResetToEarliest()) }()
	time.Sleep(10 * time.Millisecond) // the seek waits for offset 0, in flight
	once.Do(func() { close(slow) })
	select {
	case err := <-sought:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Seek did not return")
	}
	// From the start again: every offset at least once after the seek.
	ferrytest.WaitFor(t, 0, "every message after the seek", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		last := map[string]int64{}
		for key, offs := range log.done {
			last[key] = offs[len(offs)-1]
		}
		return len(last) == 3 && last["k0"] >= n-3 && last["k1"] >= n-2 && last["k2"] >= n-1
	}, log.wake)
	log.mu.Lock()
	defer log.mu.Unlock()
	assert.Empty(t, log.overlaps)
}

// A poison key never stalls the queue for good: its message fails every
// attempt and goes to the dead-letter topic, the other keys complete
// meanwhile, and the key's later messages follow it in order. With a
// small MaxSpan the span fills behind the stuck key while it retries:
// fetching waits (the buffer takes nothing beyond the span) until the
// poison message is dead-lettered, and then everything flows; nothing
// deadlocks.
func TestOrderedByKeyPoisonKey(t *testing.T) {
	for _, span := range []int{0, 32} {
		t.Run("span"+strconv.Itoa(span), func(t *testing.T) {
			ctx := context.Background()
			b := newTopic(t, 1)
			const n = 400
			ferrytest.Produce(t, b, "t", "m", n, 8) // key k0 at offsets 0, 8, 16…
			log := newKeyLog()
			opts := []ferry.ConsumerOption{ferry.OrderedByKey(), ferry.WithConcurrency(4), ferry.WithRetry(4, 2*time.Millisecond)}
			if span > 0 {
				opts = append(opts, ferry.WithMaxSpan(int64(span)))
			}
			c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
				log.enter(m)
				if m.Offset == 0 {
					log.leave(m, false)
					return errors.New("poison")
				}
				log.leave(m, true)
				return nil
			}), opts...)
			require.NoError(t, err)
			require.NoError(t, c.Start(ctx))
			defer c.Close()
			ferrytest.WaitFor(t, 0, "every other message", func() bool { return log.total() >= n-1 }, log.wake)
			ferrytest.WaitFor(t, 0, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 }, nil)
			log.checkOrder(t)
			log.mu.Lock()
			defer log.mu.Unlock()
			assert.Equal(t, int64(8), log.done["k0"][0], "k0's next message after the dead letter")
			assert.Len(t, log.done["k0"], n/8-1)
		})
	}
}

// Many keys, random handler durations, 64 workers: no key's messages
// overlap or leave offset order.
func TestOrderedByKeyManyWorkers(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 2)
	const n, keys = 4000, 200
	ferrytest.Produce(t, b, "t", "m", n, keys)
	log := newKeyLog()
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		log.enter(m)
		if m.Offset%7 == 0 {
			time.Sleep(time.Duration(m.Offset%5) * 100 * time.Microsecond)
		}
		log.leave(m, true)
		return nil
	}), ferry.OrderedByKey(), ferry.WithConcurrency(64))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	ferrytest.WaitFor(t, 0, "every message", func() bool { return log.total() >= n }, log.wake)
	log.checkOrder(t)
	assert.Equal(t, n, log.total())
}
