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
	ready   []*queueRun
	retries []*retryItem
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
	s.ready = append(s.ready, r)
	return true
}

// pushRetry lists a retry that is due.
func (s *scheduler) pushRetry(it *retryItem) {
	s.mu.Lock()
	s.retries = append(s.retries, it)
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
		if len(s.retries) > 0 {
			it = s.retries[0]
			s.retries[0] = nil
			s.retries = s.retries[1:]
		} else {
			for len(s.ready) > 0 && r == nil {
				r = s.ready[0]
				s.ready[0] = nil
				s.ready = s.ready[1:]
				r.inReady = false
				if r.releasing.Load() {
					r = nil
				}
			}
		}
		more := len(s.retries) > 0 || len(s.ready) > 0
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
