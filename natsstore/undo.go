package natsstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
