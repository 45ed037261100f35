package natsstore

import (
	"bytes"
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
// revision) and watched by every session of the group; and
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
	s.rev = rev
	wctx, wcancel := context.WithCancel(context.Background())
	w, err := c.members.Watch(wctx, s.prefix+".*")
	if err != nil {
		wcancel()
		c.takeBack(c.members, s.key, s.nonce)
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s: watch", g), Err: err}
	}
	set := map[string]bool{}
	for initial := true; initial; {
		select {
		case e := <-w.Updates():
			if e == nil {
				initial = false
				break
			}
			s.apply(set, e)
		case <-ctx.Done():
			stopWatcher(w, c.cfg.opTimeout)
			wcancel()
			c.takeBack(c.members, s.key, s.nonce)
			return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: ctx.Err()}
		}
	}
	set[member] = true // it was created before the watch started
	s.publish(set)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		stopWatcher(w, c.cfg.opTimeout)
		wcancel()
		c.takeBack(c.members, s.key, s.nonce)
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: join %s", g), Err: ferry.ErrClosed}
	}
	c.sessions[s] = struct{}{}
	c.mu.Unlock()
	s.wg.Go(func() { s.heartbeat(start) })
	s.wg.Go(func() { s.watch(set, w, wcancel) })
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

// deleteOwn deletes key if it holds value (a key this session created
// though its create seemed to fail), and reports whether it did.
func (c *Coordinator) deleteOwn(kv jetstream.KeyValue, key string, value []byte) bool {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.opTimeout)
	defer cancel()
	return deleteOwn(ctx, kv, key, value)
}

func deleteOwn(ctx context.Context, kv jetstream.KeyValue, key string, value []byte) bool {
	e, err := kv.Get(ctx, key)
	if err != nil || !bytes.Equal(e.Value(), value) {
		return false
	}
	return kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())) == nil
}

// takeBack undoes a create of key with value whose outcome is unknown (it
// failed with a timeout or a cancelled ctx, and may have been applied or
// be still on its way), or of a key made but then given up. A read cannot
// tell: it may run before the create lands. A second create can: the
// bucket's stream applies this connection's writes in order, so by the
// time the second is answered the first has landed or never will. If the
// second one succeeds, the first did not (and the key just made is
// deleted); if the key exists and holds value, the first did (and it is
// deleted). When no server answers (a partition), it goes on in the
// background (see undo).
func (c *Coordinator) takeBack(kv jetstream.KeyValue, key string, value []byte) {
	c.undo(kv, key, func(ctx context.Context) bool { return takeBackTry(ctx, c.js, kv, key, value) })
}

// takeBackTry is one try of takeBack: false if it was not answered.
func takeBackTry(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, value []byte) bool {
	rev, err := kv.Create(ctx, key, value)
	switch {
	case err == nil:
		err = kv.Delete(ctx, key, jetstream.LastRevision(rev))
		return err == nil || !unanswered(err) // a mismatch: someone else's write since
	case errors.Is(err, jetstream.ErrKeyExists):
		e, ok, err := leaderLast(ctx, js, kv, key) // a follower's read may be behind the create
		switch {
		case err != nil:
			return !unanswered(err)
		case !ok || !bytes.Equal(e.value, value):
			return true // gone, or another session's
		}
		err = kv.Delete(ctx, key, jetstream.LastRevision(e.rev))
		return err == nil || !unanswered(err) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch)
	}
	return !unanswered(err)
}

// undoKey names a key that an undoing is for.
type undoKey struct{ bucket, key string }

// undoing is a write this coordinator gave up and undoes: try, until it
// reports done (it was answered).
type undoing struct {
	mu   sync.Mutex // held during a try
	try  func(context.Context) bool
	done bool
}

// undo makes sure a key this coordinator made, or may have made, and
// gave up (a create timed out, a session or lease ended) does not
// outlive the give-up holding a member ID or a queue's lock that nobody
// renews: try is tried at once, and while it goes unanswered, again
// every retryBackoff in the background, each try bounded by the op
// timeout, until one is answered or Close begins. The servers may be
// out of reach behind a partition that holds the writes sent into it
// and delivers them at the heal, a join's create or a renewal after its
// session was given up among them; such a key, landed at the heal, held
// the member's ID and a share of the group's queues for a whole TTL
// (issue 30: a join that timed out in a 3 × TTL partition came back as
// a ghost member, and the group handed it queues). A try goes out only
// after the one before was given up, on the same connection, so the
// first try answered after the heal sees every write sent before it
// applied. A Join or Lock refused because the key exists runs the key's
// undoings at once (undoNow).
func (c *Coordinator) undo(kv jetstream.KeyValue, key string, try func(context.Context) bool) {
	u := &undoing{try: try}
	if c.undoTry(u) {
		return
	}
	k := undoKey{kv.Bucket(), key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.undoing[k] = append(c.undoing[k], u)
	c.bg.Go(func() {
		defer c.undone(k, u)
		for !c.undoTry(u) {
			select {
			case <-time.After(retryBackoff):
			case <-c.life.Done():
				return
			}
		}
	})
}

// undoTry tries u once, unless it is done; it reports whether u is done.
func (c *Coordinator) undoTry(u *undoing) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.done && c.life.Err() == nil {
		ctx, cancel := context.WithTimeout(c.life, c.cfg.opTimeout)
		u.done = u.try(ctx)
		cancel()
	}
	return u.done || c.life.Err() != nil
}

func (c *Coordinator) undone(k undoKey, u *undoing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.undoing[k] = slices.DeleteFunc(c.undoing[k], func(x *undoing) bool { return x == u })
	if len(c.undoing[k]) == 0 {
		delete(c.undoing, k)
	}
}

// undoNow tries the undoings of key at once, and reports whether any of
// them was done now: a create refused because the key exists may then
// succeed.
func (c *Coordinator) undoNow(kv jetstream.KeyValue, key string) bool {
	c.mu.Lock()
	us := slices.Clone(c.undoing[undoKey{kv.Bucket(), key}])
	c.mu.Unlock()
	did := false
	for _, u := range us {
		u.mu.Lock()
		was := u.done
		u.mu.Unlock()
		if !was && c.undoTry(u) {
			did = true
		}
	}
	return did
}

// release deletes key, which a session made holding value and last
// renewed, as far as it knows, to revision rev; it returns nil once the
// bucket's leader has the key deleted, gone or someone else's. The
// renewal the session knows of may not be the last: one in flight when
// the session stopped, or one whose reply was lost, may have landed
// after it, and one still in flight makes a replicated bucket refuse
// any other write of the key. (A delete refused so left the key until
// its TTL: the member listed, the lock held.) So a delete refused for its revision reads the key from the leader and
// deletes it at the revision found while it holds value, after a pause
// when the revision is the one refused (a write of it still in flight).
// A delete no server answered is tried again. ctx bounds it all.
func (c *Coordinator) release(ctx context.Context, kv jetstream.KeyValue, key string, value []byte, rev uint64) error {
	for {
		err := kv.Delete(ctx, key, jetstream.LastRevision(rev))
		switch {
		case err == nil:
			return nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			e, ok, lerr := leaderLast(ctx, c.js, kv, key)
			if lerr != nil {
				return lerr
			}
			if !ok || !bytes.Equal(e.value, value) {
				return nil // deleted, expired, or another session's
			}
			if e.rev != rev {
				rev = e.rev
				continue
			}
		case !unanswered(err) || ctx.Err() != nil:
			return err
		}
		select {
		case <-time.After(retryBackoff):
		case <-ctx.Done():
			return err
		}
	}
}

// undoRelease goes on with a release no server answered, in the
// background (see undo): a renewal held in a partition would otherwise
// keep the key a TTL past the heal.
func (c *Coordinator) undoRelease(kv jetstream.KeyValue, key string, value []byte, rev uint64) {
	c.undo(kv, key, func(ctx context.Context) bool {
		err := c.release(ctx, kv, key, value, rev)
		return err == nil || !unanswered(err)
	})
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
	es, err := leaderLive(ctx, c.js, c.members, groupPrefix(g)+".*")
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

	mu     sync.Mutex // guards rev, ended and leases
	rev    uint64     // of the member key
	ended  bool
	leases map[int]*lease
}

func (s *session) Changed() <-chan struct{} { return s.changed }
func (s *session) Done() <-chan struct{}    { return s.done }

func (s *session) Members() []string {
	if p := s.members.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

func (s *session) apply(set map[string]bool, e jetstream.KeyValueEntry) {
	m, ok := memberOf(e.Key())
	if !ok {
		return
	}
	if e.Operation() == jetstream.KeyValuePut {
		set[m] = true
	} else {
		delete(set, m)
	}
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
func (s *session) watch(set map[string]bool, w jetstream.KeyWatcher, cancel context.CancelFunc) {
	defer cancel()
	defer stopWatcher(w, s.c.cfg.opTimeout)
	for {
		select {
		case <-s.stop:
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			s.apply(set, e)
			if e.Key() == s.key && e.Operation() != jetstream.KeyValuePut {
				s.publish(set)
				s.wg.Go(func() { _ = s.end(context.Background(), true) }) // end waits for leases, not for this goroutine
				return
			}
			s.publish(set)
		}
	}
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
			s.rev = nrev
			s.mu.Unlock()
			last, unknown = start, time.Time{}
			deadline.Reset(time.Until(start.Add(life)))
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound):
			switch nrev, st := s.c.applied(s.c.members, s.key, string(s.nonce), rev, last.Add(life)); st {
			case renewApplied:
				s.mu.Lock()
				s.rev = nrev
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
// seen absent; and at most a TTL, as a safety net. v is what the watch
// told the calls before, for one Lock.
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
	safety := time.NewTimer(s.c.cfg.ttl)
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
