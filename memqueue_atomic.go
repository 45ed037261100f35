package ferry

import (
	"context"
	"fmt"
)

// memPart is one queue's share of an atomic write across memory queues
// (see writeAtomic): its messages, and then where the first went, or
// closed when the queue was closed and took none. (The queues are
// another slice: with them here, escape analysis would send the
// messages' slices, often on the caller's stack, to the heap.)
type memPart struct {
	msgs   []*EnhancedMessage
	first  int64
	closed bool
}

// writeAtomic writes each part's messages to its queue, qs[i] for
// parts[i], with every queue locked, so that a reader of the queues sees
// all of them or none (deduplicated as a write is: a duplicate is not
// stored, and gets where its first copy went). check, when not nil, is
// called once everything fits, the queues still locked: its error writes
// nothing. The first part's queue must be open (else ErrClosed, and
// nothing is written); another part whose queue is closed is skipped
// (its closed set). It waits for room as Write does, until ctx ends
// (writing nothing). The queues must be distinct, at most 8.
func writeAtomic(ctx context.Context, qs []*MemoryQueue, parts []memPart, check func() error) error {
	var sizes [8]int64
	var keyeds [8]bool
	var adms [8]admitted
	var order [8]int // the parts in the order their queues are locked
	if len(parts) > len(order) || len(qs) != len(parts) {
		return fmt.Errorf("%w: an atomic write of %d parts to %d queues (at most %d)", ErrInvalidMessage, len(parts), len(qs), len(order))
	}
	for i := range parts {
		var err error
		if sizes[i], keyeds[i], err = qs[i].measure(parts[i].msgs); err != nil {
			return err
		}
		// Locked in the order the queues were made: two writes over the
		// same queues never wait for each other's locks.
		j := i
		for ; j > 0 && qs[order[j-1]].seq > qs[i].seq; j-- {
			order[j] = order[j-1]
		}
		order[j] = i
	}
	locked := order[:len(parts)]
	unlock := func() {
		for _, i := range locked {
			qs[i].mu.Unlock()
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return &Error{Op: fmt.Sprintf("write %s", qs[0].id), Err: err}
		}
		for _, i := range locked {
			qs[i].mu.Lock()
		}
		if qs[0].closed {
			unlock()
			return &Error{Op: fmt.Sprintf("write %s", qs[0].id), Err: ErrClosed}
		}
		now := stampTime()
		var full chan struct{}
		done := 0 // parts admitted, in the order of parts
		for i := range parts {
			p := &parts[i]
			if p.closed = qs[i].closed; p.closed {
				done++
				continue
			}
			a, ok := qs[i].admit(p.msgs, sizes[i], keyeds[i], now)
			if !ok {
				full = qs[i].spaceLocked()
				break
			}
			adms[i] = a
			done++
		}
		var err error
		if full == nil && check != nil {
			err = check()
		}
		if full != nil || err != nil {
			for i := range parts[:done] {
				if !parts[i].closed {
					qs[i].unadmit(adms[i])
				}
			}
			unlock()
			if err != nil {
				return err
			}
			select {
			case <-full:
			case <-ctx.Done():
			}
			continue
		}
		for i := range parts {
			if !parts[i].closed {
				parts[i].first = qs[i].appendLocked(adms[i], now)
			}
		}
		unlock()
		return nil
	}
}
