package natsstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go/jetstream"
)

func (s *session) lockKey(q int) string { return s.prefix + "." + strconv.Itoa(q) }

// Lock implements [ferry.Session]: a KV create of the lock key; while it
// exists, a watch of the key wakes the waiter on its deletion or expiry.
func (s *session) Lock(ctx context.Context, q int) (ferry.Lease, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: lock %s queue %d", s.g, q), Err: err}
	}
	if q < 0 || q >= ferry.MaxQueues {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: lock %s queue %d", s.g, q), Err: fmt.Errorf("%w: out of range", ferry.ErrInvalidOption)}
	}
	expired := func() error {
		return &ferry.Error{Op: fmt.Sprintf("natsstore: lock %s queue %d", s.g, q), Err: ferry.ErrSessionExpired}
	}
	select {
	case <-s.stop:
		return nil, expired()
	default:
	}
	key := s.lockKey(q)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var w jetstream.KeyWatcher
	var view keyView // what w has told
	defer func() {
		if w != nil {
			stopWatcher(w, s.c.cfg.opTimeout)
		}
	}()
	for {
		start := time.Now()
		octx, ocancel := s.c.cfg.bound(ctx)
		rev, err := s.c.locks.Create(octx, key, s.nonce)
		ocancel()
		if err == nil {
			return s.granted(q, key, rev, start)
		}
		if errors.Is(err, jetstream.ErrKeyExists) && (s.c.deleteOwn(s.c.locks, key, s.nonce) || s.c.undoNow(s.c.locks, key)) {
			continue // our own, from a create whose reply was lost, or one this coordinator gave up: free now
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			select { // a passing failure: try again shortly (the next create tells whether this one landed)
			case <-time.After(retryBackoff):
			case <-s.stop:
				s.c.takeBack(s.c.locks, key, s.nonce)
				return nil, expired()
			case <-ctx.Done():
				s.c.takeBack(s.c.locks, key, s.nonce)
				return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: lock %s queue %d", s.g, q), Err: ctx.Err()}
			}
			continue
		}
		if w == nil {
			if w, err = s.c.locks.Watch(wctx, key); err != nil {
				w = nil
				continue
			}
		}
		if err := s.awaitFree(ctx, w, &view); err != nil {
			if errors.Is(err, ferry.ErrSessionExpired) {
				return nil, expired()
			}
			return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: lock %s queue %d", s.g, q), Err: err}
		}
	}
}

// keyView is what a lock key's watch has told so far: whether its
// initial values are in (known) and whether the key holds a value.
type keyView struct{ known, live bool }

// awaitFree waits until the watched lock key is deleted, expires or is
// seen absent; and at most TTL/3, as a safety net: the watch is an
// ordered consumer served by one server, and a server stopped without
// closing its connections leaves it silent for as long (see
// session.watch), so the next create, answered by the bucket's leader,
// tells within TTL/3 of the key's expiry that it is free. (With a TTL
// of safety net, a Lock whose watch was on a stopped server took its
// queue a TTL late.) v is what the watch told the calls before, for one
// Lock.
//
// A create refused right after the watch saw the key deleted is no sign
// that anyone took it: the bucket's leader refuses a write of a key
// while the delete is still being applied, and the create's read of a
// deleted key may be served by a follower behind (seen: a Lock woken by
// the delete was refused and waited for the TTL on a watch that had
// nothing more to say). So while the watch says the key is free, the
// next create is tried after retryBackoff, unless the watch shows the key
// taken first.
func (s *session) awaitFree(ctx context.Context, w jetstream.KeyWatcher, v *keyView) error {
	safety := time.NewTimer(s.c.cfg.ttl / 3)
	defer safety.Stop()
	var again <-chan time.Time
	if v.known && !v.live {
		t := time.NewTimer(retryBackoff)
		defer t.Stop()
		again = t.C
	}
	for {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil
			case e == nil:
				v.known = true
				if !v.live {
					return nil
				}
			case e.Operation() == jetstream.KeyValuePut:
				v.live, again = true, nil
			default:
				v.live = false
				return nil
			}
		case <-again:
			return nil
		case <-safety.C:
			return nil
		case <-s.stop:
			return ferry.ErrSessionExpired
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// granted registers a lease of a created lock key and starts its renewal.
func (s *session) granted(q int, key string, rev uint64, start time.Time) (ferry.Lease, error) {
	l := &lease{s: s, q: q, key: key, token: rev, rev: rev, lost: make(chan struct{}), stop: make(chan struct{}), exited: make(chan struct{})}
	l.until.Store(start.Add(time.Duration(float64(s.c.cfg.ttl) * s.c.cfg.safety)).UnixNano())
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		s.c.takeBack(s.c.locks, key, s.nonce)
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: lock %s queue %d", s.g, q), Err: ferry.ErrSessionExpired}
	}
	s.leases[q] = l
	s.wg.Go(func() { l.renew(start) })
	s.mu.Unlock()
	return l, nil
}

// lease is the holding of one lock key.
type lease struct {
	s      *session
	q      int
	key    string
	token  uint64
	lost   chan struct{}
	stop   chan struct{} // closed when given up: stops renew
	exited chan struct{} // closed when renew returned

	rev  uint64 // guarded by s.mu
	gone bool   // guarded by s.mu
	// until is when the lease counts itself lost (Unix ns): the start of
	// its last successful renewal + safety × TTL, as its lost timer.
	until atomic.Int64
}

var _ ferry.DeadlineLease = (*lease)(nil)

func (l *lease) Token() uint64         { return l.token }
func (l *lease) Lost() <-chan struct{} { return l.lost }

// Deadline implements [ferry.DeadlineLease]: the moment the lease's own
// timer counts it lost, so a member paused past it starts nothing more
// even before that timer has run.
func (l *lease) Deadline() (time.Time, bool) { return time.Unix(0, l.until.Load()), true }

// Release implements [ferry.Lease]: a delete checked against the lease's
// revision, so it never frees a lock someone else holds now.
func (l *lease) Release(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("natsstore: release %s queue %d", l.s.g, l.q), Err: err}
	}
	l.give(false)
	return nil
}

// give gives the lease up: it stops renewal, closes Lost when lost, and
// deletes the key if it is still the lease's. Called once per lease with
// effect; not from renew.
func (l *lease) give(lost bool) {
	s := l.s
	s.mu.Lock()
	if l.gone {
		s.mu.Unlock()
		return
	}
	l.gone = true
	if s.leases[l.q] == l {
		delete(s.leases, l.q)
	}
	close(l.stop)
	if lost {
		close(l.lost)
	}
	s.mu.Unlock()
	<-l.exited
	s.mu.Lock()
	rev := l.rev
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.c.cfg.opTimeout)
	defer cancel()
	if err := s.c.release(ctx, s.c.locks, l.key, s.nonce, rev); err != nil && unanswered(err) {
		s.c.undoRelease(s.c.locks, l.key, s.nonce, rev)
	}
}

// renew renews the lock key every TTL/3. The lease is lost by a timer of
// its own, at the start of its last successful renewal + safety × TTL,
// whatever a renewal in flight is doing (a check in this loop would come
// up to a renewal's timeout late, after the server freed the key), or
// when the key is no longer its own. A lost key is left to expire.
func (l *lease) renew(start time.Time) {
	s := l.s
	cfg := s.c.cfg
	life := time.Duration(float64(cfg.ttl) * cfg.safety)
	lostTimer := time.AfterFunc(time.Until(start.Add(life)), l.lose)
	tick := time.NewTicker(cfg.ttl / 3)
	var unknown time.Time // the start of the first try since the last success
	defer func() {
		lostTimer.Stop()
		tick.Stop()
		close(l.exited)
	}()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		s.mu.Lock()
		rev := l.rev
		s.mu.Unlock()
		start := time.Now()
		if unknown.IsZero() {
			unknown = start
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(cfg.ttl/3, time.Until(start.Add(life))))
		nrev, err := s.c.locks.Update(ctx, l.key, s.nonce, rev)
		cancel()
		switch {
		case err == nil:
			if !lostTimer.Stop() {
				return // lost meanwhile
			}
			s.mu.Lock()
			l.rev = nrev
			s.mu.Unlock()
			l.until.Store(start.Add(life).UnixNano())
			lostTimer.Reset(time.Until(start.Add(life)))
			unknown = time.Time{}
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound):
			switch nrev, st := s.c.applied(s.c.locks, l.key, string(s.nonce), rev, start.Add(life)); st {
			case renewApplied:
				if !lostTimer.Stop() {
					return // lost meanwhile
				}
				s.mu.Lock()
				l.rev = nrev
				s.mu.Unlock()
				// The try applied began no earlier than the first one
				// since the last success.
				l.until.Store(unknown.Add(life).UnixNano())
				lostTimer.Reset(time.Until(unknown.Add(life)))
				unknown = time.Time{}
			case renewRefused:
				l.lose()
				return
			}
		}
	}
}

// lose marks the lease lost: Lost closed, renewal stopped. It only
// closes channels, so a timer may call it.
func (l *lease) lose() {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.gone {
		return
	}
	l.gone = true
	if s.leases[l.q] == l {
		delete(s.leases, l.q)
	}
	close(l.stop)
	close(l.lost)
}

// renewOutcome is what a renewal refused for its revision turns out to be.
type renewOutcome int

const (
	renewUnknown renewOutcome = iota // could not tell: try again at the next tick
	renewApplied                     // an earlier try was applied after all
	renewRefused                     // the key is gone or someone else's
)

// applied looks at key after an update with revision rev was refused for
// its revision. An earlier try whose reply was lost (its server died
// after applying it) leaves the key holding member at a later revision:
// that revision is returned, to renew from. A key that is gone or holds
// another value (another session's: the value is the session's nonce) is
// refused. The look is bounded by until (the caller's
// safety deadline) and the op timeout.
func (c *Coordinator) applied(kv jetstream.KeyValue, key, value string, rev uint64, until time.Time) (uint64, renewOutcome) {
	ctx, cancel := context.WithTimeout(context.Background(), min(c.cfg.opTimeout, time.Until(until)))
	defer cancel()
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return 0, renewRefused
	case err != nil:
		return 0, renewUnknown
	case string(e.Value()) == value && e.Revision() > rev:
		return e.Revision(), renewApplied
	}
	return 0, renewRefused
}
