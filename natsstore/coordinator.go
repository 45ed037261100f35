package natsstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go/jetstream"
)

// Coordinator is a [ferry.Coordinator] over two KV buckets whose entries
// live for the TTL (see [WithTTL]): "<prefix>_members", a key per member
// of a group, put again every TTL/3 (a heartbeat, compare-and-set on its
// revision) and watched by every session of the group (and read from the
// bucket's leader while a session's watch falls behind its own
// heartbeats, as it does when the server serving it is stopped); and
// "<prefix>_locks", a key per locked (group, queue), made with a create
// (it fails while the key exists), renewed every TTL/3 by compare-and-set
// and released by a delete checked against the holder's revision. A
// lease's fencing token is the revision its key was created with: the
// bucket's revisions only grow, so tokens do too, across processes and
// restarts. The buckets mark keys that expire, so waiters and watchers
// see an expiry at once.
//
// A session or lease counts itself lost, from a timer of its own, at the
// start of its last successful renewal + safety × TTL (see [WithSafety]):
// before the server can expire its key and anyone else can take it. A
// session also ends when its member key is deleted or expires.
//
// A member ID is taken while its key lives: a process that died and
// restarts with the same ID within the TTL gets [ferry.ErrInvalidOption]
// from Join until the old key expires. A session's Members come from its
// watch, which on a replicated bucket may be served by a follower a
// little behind the leader. [Coordinator.Members] asks the bucket's
// leader, which answers only after applying the writes it acknowledged,
// so it sees every Join and Leave that has returned, in any process:
// it reads its own writes, as [ferry.Coordinator] asks, and others'
// as soon as they are acknowledged. An expiry shows once the key is
// gone: deleted by the session that counted itself lost, or expired by
// the server within the TTL of its last heartbeat. A Leave that
// cannot delete its member key (the bucket out of reach) returns the
// error, and the member stays listed until the key expires. Locks and
// tokens are decided by the bucket's leader alone.
//
// A key the coordinator gave up while no server answered (a join or
// lock whose create timed out, a session's or lease's delete) is undone
// in the background until a try is answered, so that writes held in a
// partition and delivered at its heal leave no key that nobody renews
// (see undo).
//
// A Coordinator is safe for concurrent use. Each session runs two
// goroutines (heartbeat, watch), each lease one (renewal) and each undo
// one; Close ends every session, gives the undoing up, and waits for
// them all.
type Coordinator struct {
	cfg     config
	js      jetstream.JetStream
	members jetstream.KeyValue
	locks   jetstream.KeyValue

	// life ends when Close begins: it bounds the undoing of keys given
	// up (see undo), run by bg.
	life context.Context
	kill context.CancelFunc
	bg   sync.WaitGroup

	mu       sync.Mutex // guards sessions, closed and undoing
	sessions map[*session]struct{}
	closed   bool
	undoing  map[undoKey][]*undoing
}

var (
	_ ferry.Coordinator = (*Coordinator)(nil)
	_ ferry.Session     = (*session)(nil)
	_ ferry.Lease       = (*lease)(nil)
)

// NewCoordinator returns a Coordinator over js, creating its buckets if
// they are absent. A bucket made before with another TTL is
// [ferry.ErrInvalidOption]: every member must agree on the TTL.
func NewCoordinator(ctx context.Context, js jetstream.JetStream, opts ...Option) (*Coordinator, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "natsstore: coordinator", Err: err}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, &ferry.Error{Op: "natsstore: coordinator", Err: err}
	}
	if js == nil {
		return nil, &ferry.Error{Op: "natsstore: coordinator", Err: fmt.Errorf("%w: nil JetStream", ferry.ErrInvalidOption)}
	}
	ctx, cancel := cfg.bound(ctx)
	defer cancel()
	c := &Coordinator{cfg: cfg, js: js, sessions: map[*session]struct{}{}, undoing: map[undoKey][]*undoing{}}
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{"members", &c.members}, {"locks", &c.locks}} {
		kv, err := bucket(ctx, js, cfg, b.name, true, false)
		if err != nil {
			return nil, err
		}
		st, err := askExisting(ctx, cfg, kv.Status)
		if err != nil {
			return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: coordinator: bucket %s", b.name), Err: err}
		}
		if st.TTL() != cfg.ttl {
			return nil, &ferry.Error{Op: "natsstore: coordinator", Err: fmt.Errorf("%w: bucket %s has TTL %v, want %v", ferry.ErrInvalidOption, st.Bucket(), st.TTL(), cfg.ttl)}
		}
		*b.kv = kv
	}
	c.life, c.kill = context.WithCancel(context.Background())
	return c, nil
}

func groupPrefix(g ferry.GroupKey) string { return encodeToken(g.Scope) + "." + encodeToken(g.Topic) }

// Join implements [ferry.Coordinator].
func (c *Coordinator) Join(ctx context.Context, g ferry.GroupKey, member string) (ferry.Session, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: err}
	}
	if g.Scope == "" || member == "" {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: fmt.Errorf("%w: empty group or member", ferry.ErrInvalidOption)}
	}
	if err := ferry.ValidateTopicName(g.Topic); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: err}
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: ferry.ErrClosed}
	}
	ctx, cancel := c.cfg.bound(ctx)
	defer cancel()
	s := &session{
		c: c, g: g, member: member, prefix: groupPrefix(g), key: groupPrefix(g) + "." + encodeToken(member),
		changed: make(chan struct{}, 1), done: make(chan struct{}), stop: make(chan struct{}),
		leases: map[int]*lease{},
		nonce:  []byte(member + " " + strconv.FormatUint(rand.Uint64(), 36)),
	}
	start := time.Now()
	rev, err := c.members.Create(ctx, s.key, s.nonce)
	if errors.Is(err, jetstream.ErrKeyExists) && c.undoNow(c.members, s.key) {
		rev, err = c.members.Create(ctx, s.key, s.nonce) // the key was one this coordinator gave up
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, &ferry.Error{Op: "natsstore: join", Err: fmt.Errorf("%w: member %q already in group %q of topic %q", ferry.ErrInvalidOption, member, g.Scope, g.Topic)}
	}
	if err != nil {
		// The create may have gone through (a timeout after the send):
		// a key of ours would hold the member ID and a share of the
		// queues until it expired. Take it back.
		c.takeBack(c.members, s.key, s.nonce)
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: err}
	}
	s.rev, s.wroteAt = rev, time.Now()
	wctx, wcancel := context.WithCancel(context.Background())
	w, err := c.members.Watch(wctx, s.prefix+".*")
	if err != nil {
		wcancel()
		c.takeBack(c.members, s.key, s.nonce)
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s: watch", g), Err: err}
	}
	v := &memberView{set: map[string]bool{}}
	for initial := true; initial; {
		select {
		case e := <-w.Updates():
			if e == nil {
				initial = false
				break
			}
			v.apply(e)
		case <-ctx.Done():
			stopWatcher(w, c.cfg.opTimeout)
			wcancel()
			c.takeBack(c.members, s.key, s.nonce)
			return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: ctx.Err()}
		}
	}
	v.set[member] = true // it was created before the watch started
	s.publish(v.set)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		stopWatcher(w, c.cfg.opTimeout)
		wcancel()
		c.takeBack(c.members, s.key, s.nonce)
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: ferry.ErrClosed}
	}
	s.life, s.kill = context.WithCancel(context.Background())
	c.sessions[s] = struct{}{}
	c.mu.Unlock()
	s.wg.Go(func() { s.heartbeat(start) })
	s.wg.Go(func() { s.watch(v, w, wcancel) })
	return s, nil
}

// stopWatcher stops w and drains its updates until the watch closes
// them (or bound passes). A watch read only now and then (a Lock reads
// its key's watch only while it waits) can fall 256 updates behind: its
// delivery goroutine then blocks on the full channel, and stays blocked
// after Stop unless someone reads (goleak caught one in CI).
func stopWatcher(w jetstream.KeyWatcher, bound time.Duration) {
	_ = w.Stop()
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// Members implements [ferry.Coordinator]: it asks the members bucket's
// leader (see [Coordinator]), a stream info and a get per key.
func (c *Coordinator) Members(ctx context.Context, g ferry.GroupKey) ([]string, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: members of %s", g), Err: err}
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: members of %s", g), Err: ferry.ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: members of %s", g), Err: err}
	}
	ctx, cancel := c.cfg.bound(ctx)
	defer cancel()
	es, _, err := leaderLive(ctx, c.js, c.members, groupPrefix(g)+".*")
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: members of %s", g), Err: err}
	}
	var out []string
	for _, e := range es {
		if m, ok := memberOf(e.key); ok {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out, nil
}

func memberOf(key string) (string, bool) {
	i := strings.LastIndexByte(key, '.')
	return decodeToken(key[i+1:])
}

// Close implements [io.Closer]: every session ends (its leases lost) and
// Close waits for their goroutines. Idempotent.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ss := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		ss = append(ss, s)
	}
	c.mu.Unlock()
	// Stop every session before any key is freed, so that no session
	// takes a lock another one of this coordinator gives up.
	type stopped struct {
		s      *session
		leases []*lease
		rev    uint64
	}
	var st []stopped
	for _, s := range ss {
		if leases, rev, ok := s.stopping(); ok {
			st = append(st, stopped{s, leases, rev})
		}
	}
	for _, x := range st {
		_ = x.s.finish(context.Background(), x.leases, x.rev, true)
	}
	for _, s := range ss {
		s.wg.Wait()
	}
	c.kill() // the undoings still going give up
	c.bg.Wait()
	return nil
}

// session is one member's membership of a group.
type session struct {
	c       *Coordinator
	g       ferry.GroupKey
	member  string
	nonce   []byte // the value of its member and lock keys: member and a random tag, so it knows its own keys after an ambiguous failure
	prefix  string // the group's keys: prefix + "." + member
	key     string
	changed chan struct{}
	done    chan struct{} // closed when the session ended
	stop    chan struct{} // closed first: stops its goroutines and waiting Locks
	members atomic.Pointer[[]string]
	wg      sync.WaitGroup // heartbeat, watch and every lease's renewal
	// life ends when the session stops (with stop): it bounds the
	// watch's reads of the bucket's leader (see watch).
	life context.Context
	kill context.CancelFunc

	mu      sync.Mutex // guards rev, wroteAt, ended and leases
	rev     uint64     // of the member key
	wroteAt time.Time  // when rev was known written
	ended   bool
	leases  map[int]*lease
}

func (s *session) Changed() <-chan struct{} { return s.changed }
func (s *session) Done() <-chan struct{}    { return s.done }

func (s *session) Members() []string {
	if p := s.members.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// heartbeat renews the member key every TTL/3; the session is lost at
// the start of the last successful renewal + safety × TTL.
func (s *session) heartbeat(start time.Time) {
	cfg := s.c.cfg
	life := time.Duration(float64(cfg.ttl) * cfg.safety)
	last := start
	deadline := time.NewTimer(time.Until(start.Add(life)))
	defer deadline.Stop()
	tick := time.NewTicker(cfg.ttl / 3)
	defer tick.Stop()
	var unknown time.Time // the start of the first try since the last success
	for {
		select {
		case <-s.stop:
			return
		case <-deadline.C:
			s.wg.Go(func() { _ = s.end(context.Background(), true) })
			return
		case <-tick.C:
		}
		s.mu.Lock()
		rev := s.rev
		s.mu.Unlock()
		start := time.Now()
		if unknown.IsZero() {
			unknown = start
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(cfg.ttl/3, time.Until(last.Add(life))))
		nrev, err := s.c.members.Update(ctx, s.key, s.nonce, rev)
		cancel()
		switch {
		case err == nil:
			s.mu.Lock()
			s.rev, s.wroteAt = nrev, time.Now()
			s.mu.Unlock()
			last, unknown = start, time.Time{}
			deadline.Reset(time.Until(start.Add(life)))
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound):
			switch nrev, st := s.c.applied(s.c.members, s.key, string(s.nonce), rev, last.Add(life)); st {
			case renewApplied:
				s.mu.Lock()
				s.rev, s.wroteAt = nrev, time.Now()
				s.mu.Unlock()
				// The try applied began no earlier than the first one
				// since the last success.
				last, unknown = unknown, time.Time{}
				deadline.Reset(time.Until(last.Add(life)))
			case renewRefused:
				s.wg.Go(func() { _ = s.end(context.Background(), true) }) // the key expired or was deleted: others saw us leave
				return
			}
		}
	}
}

// end ends the session: its leases are lost (Lost closed first, when
// lost) and their keys deleted, its member key deleted, Done closed. It
// does not wait for the session's goroutines (a caller may be one). The
// error is the member key's delete's (see finish); nil if the session
// had ended already.
func (s *session) end(ctx context.Context, lost bool) error {
	if leases, rev, ok := s.stopping(); ok {
		return s.finish(ctx, leases, rev, lost)
	}
	return nil
}

// stopping marks the session ended and stops its goroutines and waiting
// Locks; ok is false if it had ended already.
func (s *session) stopping() (leases []*lease, rev uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, 0, false
	}
	s.ended = true
	close(s.stop)
	s.kill()
	for _, l := range s.leases {
		leases = append(leases, l)
	}
	return leases, s.rev, true
}

// finish gives up the leases of a stopped session and deletes its keys,
// the member key within ctx and the op timeout. It returns the error of
// that delete: the member then stays listed until its key expires.
func (s *session) finish(ctx context.Context, leases []*lease, rev uint64, lost bool) error {
	for _, l := range leases {
		l.give(lost)
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.cfg.opTimeout)
	err := s.c.release(ctx, s.c.members, s.key, s.nonce, rev)
	cancel()
	if err != nil && unanswered(err) {
		s.c.undoRelease(s.c.members, s.key, s.nonce, rev)
	}
	s.c.mu.Lock()
	delete(s.c.sessions, s)
	s.c.mu.Unlock()
	close(s.done)
	return err
}

// Leave implements [ferry.Session]. It returns once the session ended:
// its leases released and its member key deleted, so that
// [Coordinator.Members] no longer lists it; if the key could not be
// deleted, with the error (the key then expires within the TTL).
func (s *session) Leave(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("natsstore: leave %s", s.g), Err: err}
	}
	err := s.end(ctx, true) // a lease not released is lost when its session ends
	s.wg.Wait()
	select {
	case <-s.done:
	default: // ended by Close, still deleting its keys
		select {
		case <-s.done:
		case <-ctx.Done():
			return &ferry.Error{Op: fmt.Sprintf("natsstore: leave %s", s.g), Err: ctx.Err()}
		}
	}
	if err != nil {
		return &ferry.Error{Op: fmt.Sprintf("natsstore: leave %s", s.g), Err: err}
	}
	return nil
}
