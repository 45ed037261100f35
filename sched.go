package ferry

import (
	"context"
	"sync"
)

// scheduler hands queue runs with pending messages, and due retries, to
// whoever takes messages (workers or Poll). Wakeups go through a channel
// of capacity 1: a taker that leaves work behind passes the signal on.
type scheduler struct {
	mu      sync.Mutex // guards ready, retries and every run's inReady
	ready   fifo[queueRun]
	retries fifo[retryItem]
	wake    chan struct{}
}

func (s *scheduler) init() { s.wake = make(chan struct{}, 1) }

func (s *scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
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
func (s *scheduler) next(ctx context.Context, halt <-chan struct{}) (*queueRun, *retryItem) {
	for {
		s.mu.Lock()
		var r *queueRun
		var it *retryItem
		if s.retries.len() > 0 {
			it = s.retries.pop()
		} else {
			for s.ready.len() > 0 && r == nil {
				r = s.ready.pop()
				r.inReady = false
				if r.releasing.Load() || r.paused.Load() || r.seeking.Load() {
					r = nil // resume lists it again
				}
			}
		}
		more := s.retries.len() > 0 || s.ready.len() > 0
		s.mu.Unlock()
		if more {
			s.signal()
		}
		if r != nil || it != nil {
			return r, it
		}
		select {
		case <-s.wake:
		case <-halt:
			return nil, nil
		case <-ctx.Done():
			return nil, nil
		}
	}
}

// fifo is a queue over a slice that starts over once emptied and reuses
// its front when full, so that it does not reallocate as it cycles.
type fifo[T any] struct {
	items []*T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(x *T) {
	if len(q.items) == cap(q.items) && q.head > 0 {
		// Full, with room at the front: move the items there rather than grow.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, x)
}

// pop returns the oldest item; the queue must not be empty.
func (q *fifo[T]) pop() *T {
	x := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return x
}
