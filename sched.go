package ferry

import (
	"context"
	"sync"
	"time"
)

// scheduler hands queue runs with pending messages, and due retries, to
// whoever takes messages (workers or Poll). Wakeups go through a channel
// of capacity 1: a taker that leaves work behind passes the signal on.
//
// With a spawn function (a push consumer's), workers start on demand: a
// wake-up that finds no taker waiting starts one, up to max, and a worker
// idle for workerIdle retires, so an idle consumer parks no worker.
type scheduler struct {
	mu      sync.Mutex // guards every field below and every run's inReady
	ready   fifo[*queueRun]
	retries fifo[*retryItem]
	wake    chan struct{}

	spawn   func()          // starts a worker (which calls next until it returns nil); nil: none
	inline  func()          // runs a worker in the caller's goroutine until nothing is listed (see handOff); nil: none
	wg      *sync.WaitGroup // the member's: a worker is counted in it before it starts
	max     int             // the most workers
	running int             // workers started and not retired
	waiting int             // takers blocked in next
	halted  bool            // no worker starts any more
}

// workerIdle is how long a worker waits for work before it retires.
const workerIdle = time.Second

func (s *scheduler) init() { s.wake = make(chan struct{}, 1) }

// signal wakes a taker, starting a worker if none waits.
func (s *scheduler) signal() {
	if s.spawn != nil {
		s.mu.Lock()
		start := s.startLocked()
		s.mu.Unlock()
		if start {
			s.spawn()
		}
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// startLocked reports whether a worker is to start, and counts it (in
// running and in the member's WaitGroup): none waits, fewer than max
// run, and the member has not halted. s.mu held: the member's loop sets
// halted under it while it still counts in the WaitGroup, so no worker is
// counted in after the member's Wait can return.
func (s *scheduler) startLocked() bool {
	if s.spawn == nil || s.halted || s.waiting > 0 || s.running >= s.max {
		return false
	}
	s.running++
	s.wg.Add(1)
	return true
}

// halt stops workers from starting.
func (s *scheduler) halt() {
	s.mu.Lock()
	s.halted = true
	s.mu.Unlock()
}

// push lists r as having pending messages and wakes a taker.
func (s *scheduler) push(r *queueRun) {
	if s.list(r) {
		s.signal()
	}
}

// pushQuiet lists r without waking anyone: for a taker that comes back
// for it next (another that is awake may take it first).
func (s *scheduler) pushQuiet(r *queueRun) { s.list(r) }

// list lists r as having pending messages; false if it was listed.
func (s *scheduler) list(r *queueRun) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.inReady {
		return false
	}
	r.inReady = true
	s.ready.push(r)
	return true
}

// pushRetry lists a retry that is due.
func (s *scheduler) pushRetry(it *retryItem) {
	s.mu.Lock()
	s.retries.push(it)
	s.mu.Unlock()
	s.signal()
}

// next waits for a due retry or a run with pending messages, until halt is
// closed or ctx is done (nil, nil).
//
// idle, a worker's own stopped timer (nil for Poll), times the worker's
// idleness: a worker that waited workerIdle with nothing listed gets nil,
// nil and retires.
func (s *scheduler) next(ctx context.Context, halt <-chan struct{}, idle *time.Timer) (*queueRun, *retryItem) {
	for {
		if r, it := s.take(false); r != nil || it != nil {
			return r, it
		}
		if s.wait(ctx, halt, idle) {
			return nil, nil
		}
	}
}

// take pops a due retry or a run with pending messages, waking another
// taker when more is listed. With nothing listed it returns nil, nil,
// and, with retire, counts the calling worker out in the same critical
// section (so that a wake-up from then on starts another).
func (s *scheduler) take(retire bool) (*queueRun, *retryItem) {
	s.mu.Lock()
	var r *queueRun
	var it *retryItem
	if s.retries.len() > 0 {
		it = s.retries.pop()
	} else {
		for s.ready.len() > 0 && r == nil {
			r = s.ready.pop()
			r.inReady = false
			if !r.admits() {
				r = nil // resume lists it again
			}
		}
	}
	more := s.retries.len() > 0 || s.ready.len() > 0
	if retire && r == nil && it == nil {
		s.running--
	}
	s.mu.Unlock()
	if more {
		s.signal()
	}
	return r, it
}

// handOff is called by a fetch loop that listed its run without waking
// anyone (see queueRun.fetch) as it parks: it handles what is listed
// itself, as a worker, when one may start (no goroutine is woken or
// started for it), and wakes a taker otherwise.
func (s *scheduler) handOff() {
	if s.inline != nil {
		s.mu.Lock()
		start := s.spawn != nil && !s.halted && s.running < s.max
		if start {
			s.running++
			s.wg.Add(1)
		}
		s.mu.Unlock()
		if start {
			s.inline()
			return
		}
	}
	s.signal()
}

// wait blocks until a wake-up (false), or halt, ctx's end or, for a
// worker with nothing listed, workerIdle (true: it stops; a retiring
// worker is counted out).
func (s *scheduler) wait(ctx context.Context, halt <-chan struct{}, idle *time.Timer) (stop bool) {
	s.mu.Lock()
	s.waiting++
	s.mu.Unlock()
	retired := false
	defer func() {
		if !retired {
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
		}
	}()
	if idle == nil {
		select {
		case <-s.wake:
			return false
		case <-halt:
			return true
		case <-ctx.Done():
			return true
		}
	}
	idle.Reset(workerIdle)
	defer idle.Stop()
	for {
		select {
		case <-s.wake:
			return false
		case <-halt:
			s.retire()
			return true
		case <-ctx.Done():
			s.retire()
			return true
		case <-idle.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.ready.len() == 0 && s.retries.len() == 0 {
				// Counted out of both at once: a wake-up from now on
				// that finds no one waiting starts another worker.
				s.running--
				s.waiting--
				retired = true
				return true
			}
			return false
		}
	}
}

// retire counts out a worker that stops.
func (s *scheduler) retire() {
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
}

// fifo is a queue over a slice that starts over once emptied and reuses
// its front when full, so that it does not reallocate as it cycles. It
// holds values: pushing an interface or a pointer allocates nothing.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(x T) {
	if len(q.items) == cap(q.items) && q.head > 0 {
		// Full, with room at the front: move the items there rather than grow.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, x)
}

// pop returns the oldest item; the queue must not be empty.
func (q *fifo[T]) pop() T {
	x := q.items[q.head]
	var zero T
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return x
}
