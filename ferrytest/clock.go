package ferrytest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// FakeClock is a [ferry.Clock] that moves only when told, for testing
// delayed delivery and retries without waiting: give it to a broker with
// [ferry.WithClock], send a message due in three hours, and
// [FakeClock.Advance] three hours. Timers fire in due order, each call in
// a goroutine of its own as [ferry.Clock] says. It is safe for concurrent
// use.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer // pending, in no order
	added  chan struct{}
}

type fakeTimer struct {
	c   *FakeClock
	at  time.Time
	seq uint64
	f   func()
}

// NewFakeClock returns a clock that reads start until advanced.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{now: start, added: make(chan struct{})}
}

var _ ferry.Clock = (*FakeClock)(nil)

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc calls f in its own goroutine once the clock has advanced d
// (at once for d <= 0).
func (c *FakeClock) AfterFunc(d time.Duration, f func()) ferry.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	if d <= 0 {
		go f()
		return t
	}
	c.timers = append(c.timers, t)
	close(c.added)
	c.added = make(chan struct{})
	return t
}

// Stop implements [ferry.Timer].
func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.timers, t)
	if i < 0 {
		return false
	}
	c.timers = slices.Delete(c.timers, i, i+1)
	return true
}

// Advance moves the clock d forward, firing the timers due by then in
// due order (the clock reads each timer's time as it fires it).
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.advanceLocked(c.now.Add(d))
	c.mu.Unlock()
}

// AdvanceToNext moves the clock to the earliest pending timer's time and
// fires it (and any due at the same time). It reports false, and does
// nothing, when no timer is pending.
func (c *FakeClock) AdvanceToNext() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return false
	}
	next := c.timers[0].at
	for _, t := range c.timers[1:] {
		if t.at.Before(next) {
			next = t.at
		}
	}
	c.advanceLocked(next)
	return true
}

func (c *FakeClock) advanceLocked(to time.Time) {
	for {
		i := -1
		for j, t := range c.timers {
			if !t.at.After(to) && (i < 0 || t.at.Before(c.timers[i].at) || t.at.Equal(c.timers[i].at) && t.seq < c.timers[i].seq) {
				i = j
			}
		}
		if i < 0 {
			break
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		if t.at.After(c.now) {
			c.now = t.at
		}
		go t.f()
	}
	if to.After(c.now) {
		c.now = to
	}
}

// Timers returns the number of pending timers.
func (c *FakeClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitForTimers waits until at least n timers are pending, or ctx is
// done (its error): a test knows then that the code under test is
// waiting on the clock, and can advance it.
func (c *FakeClock) WaitForTimers(ctx context.Context, n int) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	for {
		c.mu.Lock()
		k, added := len(c.timers), c.added
		c.mu.Unlock()
		if k >= n {
			return nil
		}
		select {
		case <-added:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
