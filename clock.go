package ferry

import (
	"sync"
	"sync/atomic"
	"time"
)

// clockResync bounds how long stampTime goes without reading the wall
// clock.
const clockResync = 100 * time.Millisecond

// clockBase is the last full reading of the clock.
var clockBase atomic.Pointer[time.Time]

// stampTime returns the current time for stamping messages (BornTime,
// StoreTime). time.Now reads two clocks, wall and monotonic; stampTime
// reads the wall clock at most every clockResync and in between advances
// the last reading by the monotonic clock alone, which halves the cost of
// a timestamp (on a VM a clock read can cost 50 ns, a third of a whole
// channel handoff). The result carries a monotonic reading like
// time.Now's; its wall time can be off by the wall clock's drift or step
// since the last full reading, at most clockResync ago.
func stampTime() time.Time {
	if b := clockBase.Load(); b != nil {
		if d := time.Since(*b); d >= 0 && d < clockResync {
			return b.Add(d)
		}
	}
	now := time.Now()
	clockBase.Store(&now)
	return now
}

// The broker's coarse clock: while producers send fast, a goroutine of the
// broker reads the clock every clockTick and Send stamps messages with
// that reading instead of reading the clock itself (on a VM a read costs
// 30–50 ns, a quarter of a Send).
const (
	// clockTick is the coarse clock's resolution while it runs.
	clockTick = time.Millisecond
	// clockBurst reads within clockTick start the coarse clock: more than
	// 64,000 stamps a second.
	clockBurst = 64
	// clockIdleTicks ticks without a read stop it again.
	clockIdleTicks = 10
)

// coarseClock stamps messages. Off, it reads the clock (stampTime) per
// stamp; once stamps come faster than clockBurst per clockTick it starts
// a goroutine that refreshes a shared reading every clockTick, and stamps
// are that reading, until clockIdleTicks pass without one. The stamps one
// goroutine takes do not go backwards, across the switches too: a stamp
// read off raises floor, and a stamp read on is the later of the tick's
// reading and floor (without floor, a sender preempted between seeing
// the clock off and reading it could stamp later than the first tick's
// reading, which its next stamp would then be: seen under -race, 3 ms
// back). close stops it for good.
type coarseClock struct {
	cur   atomic.Pointer[time.Time] // the latest tick's reading, while on
	floor atomic.Int64              // Unix ns: the latest stamp read off
	on    atomic.Bool               // the goroutine refreshes cur
	used  atomic.Bool               // a stamp was taken since the last tick
	reads atomic.Uint64             // stamps taken while off
	mark  atomic.Int64              // while off: ns since epoch at the last clockBurst mark
	epoch time.Time

	mu      sync.Mutex // guards running, closed and stop
	running bool
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newCoarseClock() *coarseClock {
	return &coarseClock{epoch: stampTime(), stop: make(chan struct{})}
}

// now returns the time to stamp a message with.
func (c *coarseClock) now() time.Time {
	if c.on.Load() {
		if !c.used.Load() {
			c.used.Store(true) // written once a tick, not per stamp
		}
		t := *c.cur.Load()
		if f := c.floor.Load(); f > t.UnixNano() {
			return time.Unix(0, f) // a stamp read off, after this tick's reading
		}
		return t
	}
	t := stampTime()
	for ns := t.UnixNano(); ; {
		f := c.floor.Load()
		if f >= ns {
			if f > ns { // another goroutine's stamp, read off a newer clock base
				t = time.Unix(0, f)
			}
			break
		}
		if c.floor.CompareAndSwap(f, ns) {
			break
		}
	}
	if c.reads.Add(1)%clockBurst == 0 {
		at := int64(t.Sub(c.epoch))
		if prev := c.mark.Swap(at); at-prev < int64(clockTick) {
			c.start()
		}
	}
	return t
}

// start starts the ticking goroutine unless it runs or the clock is
// closed.
func (c *coarseClock) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running || c.closed {
		return
	}
	c.running = true
	c.wg.Add(1)
	go c.tick()
}

// tick refreshes cur every clockTick until stamps stop coming or the
// clock closes.
func (c *coarseClock) tick() {
	defer c.wg.Done()
	t := time.NewTicker(clockTick)
	defer t.Stop()
	c.refresh()
	c.on.Store(true)
	idle := 0
	for {
		select {
		case <-t.C:
		case <-c.stop:
			c.on.Store(false)
			return
		}
		c.refresh()
		if c.used.Swap(false) {
			idle = 0
			continue
		}
		if idle++; idle < clockIdleTicks {
			continue
		}
		c.mu.Lock()
		c.on.Store(false)
		c.running = false
		c.mu.Unlock()
		return
	}
}

func (c *coarseClock) refresh() {
	now := time.Now()
	c.cur.Store(&now)
}

// close stops the ticking goroutine and waits for it; stamps are read
// from the clock afterwards.
func (c *coarseClock) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
	}
	c.mu.Unlock()
	c.wg.Wait()
}
