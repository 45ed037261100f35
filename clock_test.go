package ferry

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStampTime(t *testing.T) {
	before := time.Now()
	a := stampTime()
	b := stampTime()
	after := time.Now()
	require.False(t, a.After(b), "stamps do not go backwards")
	assert.False(t, a.Before(before), "monotonic readings order stamps with time.Now")
	assert.False(t, b.After(after))
	assert.InDelta(t, float64(after.UnixNano()), float64(b.UnixNano()), float64(clockResync), "wall time within a resync of time.Now")

	// A stale base is replaced by a full reading.
	old := time.Now().Add(-2 * clockResync)
	clockBase.Store(&old)
	c := stampTime()
	assert.False(t, c.Before(after))
	assert.InDelta(t, float64(time.Now().UnixNano()), float64(c.UnixNano()), float64(clockResync))
	assert.NotSame(t, &old, clockBase.Load())
}

func BenchmarkStampTime(b *testing.B) {
	for b.Loop() {
		_ = stampTime()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		_ = time.Now()
	}
}

// The coarse clock starts ticking under a burst of stamps, stamps with
// its reading while on, does not go backwards (but for a step of
// nanoseconds where it switches on), stops when stamps stop, and close
// ends its goroutine (goleak checks in TestMain).
func TestCoarseClockStartsOnBurstAndStops(t *testing.T) {
	c := newCoarseClock()
	defer c.close()
	before := time.Now()
	prev := c.now()
	require.False(t, c.on.Load(), "one stamp does not start it")
	backs := 0
	stamp := func() {
		s := c.now()
		if s.Before(prev) {
			// Where it switches on, a stamp may step back by as much as
			// the clock moved between the goroutine's reading and its
			// publication: once.
			backs++
			require.Equal(t, 1, backs, "stamps go back only where the clock switches on")
			require.Less(t, prev.Sub(s), clockTick)
		}
		require.False(t, s.Before(before))
		prev = s
	}
	deadline := time.Now().Add(10 * time.Second)
	for !c.on.Load() {
		require.True(t, time.Now().Before(deadline), "watchdog: a burst of stamps never started the clock")
		for range clockBurst {
			stamp()
		}
		runtime.Gosched()
	}
	for range 1000 {
		stamp()
		require.False(t, prev.After(time.Now()), "a stamp is a past reading")
	}
	require.Eventually(t, func() bool { return !c.on.Load() }, 10*time.Second, time.Millisecond,
		"without stamps the clock stops")
	c.mu.Lock()
	running := c.running
	c.mu.Unlock()
	assert.False(t, running)
	s := c.now()
	assert.False(t, s.Before(prev), "stamps after it stopped do not go backwards")
}

func TestCoarseClockClosedDoesNotStart(t *testing.T) {
	c := newCoarseClock()
	c.close()
	c.close() // idempotent
	for range 10 * clockBurst {
		_ = c.now()
	}
	assert.False(t, c.on.Load())
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.False(t, c.running)
}

// A fast producer stamps messages from the coarse clock (StoreTime is
// BornTime in a memory queue), and the broker's Close stops the clock's
// goroutine.
func TestProducerStampsFromCoarseClock(t *testing.T) {
	b, err := NewBroker()
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(t.Context(), TopicMeta{Name: "t", Queues: 1, Retention: Retention{MaxMessages: 100}}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	m := &Message{Topic: "t"}
	var prev time.Time
	deadline := time.Now().Add(10 * time.Second)
	for !b.clock.on.Load() {
		require.True(t, time.Now().Before(deadline), "watchdog: fast sends never started the clock")
		for range 10 * clockBurst {
			_, err := p.Send(t.Context(), m)
			require.NoError(t, err)
		}
		runtime.Gosched()
	}
	q, err := b.Queue("t", 0)
	require.NoError(t, err)
	oldest, next := q.Offsets()
	dst := make([]*EnhancedMessage, next-oldest)
	n, err := q.Read(t.Context(), oldest, dst)
	require.NoError(t, err)
	backs := 0
	for _, em := range dst[:n] {
		if em.BornTime().Before(prev) { // once at most, where the clock switched on
			backs++
			require.Equal(t, 1, backs)
			require.Less(t, prev.Sub(em.BornTime()), clockTick)
		}
		require.Equal(t, em.BornTime(), em.StoreTime())
		prev = em.BornTime()
	}
	require.NoError(t, b.Close())
	assert.False(t, b.clock.on.Load())
}

// A goroutine's stamps do not go backwards where the coarse clock
// switches on: a stamp read off just after the first tick's reading (the
// sender was preempted between seeing the clock off and reading it) is
// not followed by that older reading.
func TestCoarseClockMonotoneAcrossSwitchOn(t *testing.T) {
	c := newCoarseClock()
	defer c.close()
	tick := time.Now().Add(-2 * time.Millisecond)
	c.cur.Store(&tick) // the first tick's reading, taken 2 ms before...
	s1 := c.now()      // ...this stamp, read with the clock still off
	c.on.Store(true)   // then the tick publishes it
	s2 := c.now()
	assert.False(t, s2.Before(s1), "stamp %v after %v", s2, s1)
	c.on.Store(false)
}
