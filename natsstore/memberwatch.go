package natsstore

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// memberView is what a session knows of its group's member keys: the
// members whose key holds a value (set), the highest revision its watch
// delivered (seen), and the bucket's revision as of the last read of the
// bucket's leader (floor: the set tells every write up to it, so the
// watch's entries up to it are old news). Owned by the watch goroutine
// once Join returns.
type memberView struct {
	set   map[string]bool
	seen  uint64
	floor uint64
}

// apply applies a watch's entry, and reports whether it was news (above
// the floor).
func (v *memberView) apply(e jetstream.KeyValueEntry) bool {
	v.seen = max(v.seen, e.Revision())
	if e.Revision() <= v.floor {
		return false
	}
	m, ok := memberOf(e.Key())
	if !ok {
		return true
	}
	if e.Operation() == jetstream.KeyValuePut {
		v.set[m] = true
	} else {
		delete(v.set, m)
	}
	return true
}

func (s *session) publish(set map[string]bool) {
	ms := make([]string, 0, len(set))
	for m := range set {
		ms = append(ms, m)
	}
	slices.Sort(ms)
	s.members.Store(&ms)
	signal(s.changed)
}

// watch follows the group's member keys until the session ends; the
// deletion or expiry of its own key ends it.
//
// The watch is an ordered consumer, served by one server of the
// bucket's. A server that stops without closing its connections
// (SIGSTOP, a frozen VM) leaves it silent: nats.go makes a new consumer
// only after two of its 5 s idle heartbeats are missed, on a server
// picked at random among those not yet known to be gone, maybe the same
// one. (Issue 30: a member's watch told nothing for the 20 s a server
// was stopped, so it never saw the other member leave, and the queues
// that member had held were handled by no one until the server
// continued.) So the watch is checked against the session's own
// heartbeats, which it must deliver: every TTL/6, if a revision of the
// member key written at least TTL/6 before is not delivered yet, the
// watch is behind, and the group's keys are read from the bucket's
// leader instead (poll), at every check until the watch delivers that
// revision. A key that expires is then seen gone within TTL/6 (and the
// time of a read) of its expiry at the leader, whatever server the
// watch is on; a watch whose updates close (its consumer could not be
// made again) is left to the polls.
func (s *session) watch(v *memberView, w jetstream.KeyWatcher, cancel context.CancelFunc) {
	defer cancel()
	defer stopWatcher(w, s.c.cfg.opTimeout)
	every := s.c.cfg.ttl / 6
	check := time.NewTicker(every)
	defer check.Stop()
	updates := w.Updates()
	var owed uint64      // the oldest revision of the member key checked for and not seen
	var owedAt time.Time // when it was written
	for {
		select {
		case <-s.stop:
			return
		case e, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			if e == nil || !v.apply(e) {
				continue
			}
			s.publish(v.set)
			if e.Key() == s.key && e.Operation() != jetstream.KeyValuePut {
				s.wg.Go(func() { _ = s.end(context.Background(), true) }) // end waits for leases, not for this goroutine
				return
			}
		case <-check.C:
			s.mu.Lock()
			rev, at := s.rev, s.wroteAt
			s.mu.Unlock()
			if v.seen >= rev {
				owed = 0
				continue
			}
			if owed == 0 || v.seen >= owed {
				owed, owedAt = rev, at
			}
			if time.Since(owedAt) < every {
				continue
			}
			if gone := s.poll(v); gone {
				s.wg.Go(func() { _ = s.end(context.Background(), true) })
				return
			}
		}
	}
}

// poll reads the group's member keys from the members bucket's leader
// into v (publishing the set if it changed), within the op timeout, and
// reports whether the session's own key is gone. A read that fails
// leaves v as it was, for the next check.
func (s *session) poll(v *memberView) (gone bool) {
	ctx, cancel := context.WithTimeout(s.life, s.c.cfg.opTimeout)
	defer cancel()
	es, last, err := leaderLive(ctx, s.c.js, s.c.members, s.prefix+".*")
	if err != nil || last <= v.floor {
		return false
	}
	set := map[string]bool{}
	for _, e := range es {
		if m, ok := memberOf(e.key); ok {
			set[m] = true
		}
	}
	v.floor = last
	if !set[s.member] {
		v.set = set
		s.publish(set)
		return true
	}
	if !maps.Equal(set, v.set) {
		v.set = set
		s.publish(set)
	}
	return false
}
