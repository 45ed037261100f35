package natsstore

import (
	"context"
	"time"

	"github.com/ferrymq/ferry"
)

// DeleteMember deletes the member key of member in g, as the server does
// when the key expires: the session sees it and ends. A test hook.
func DeleteMember(ctx context.Context, c *Coordinator, g ferry.GroupKey, member string) error {
	return c.members.Delete(ctx, groupPrefix(g)+"."+encodeToken(member))
}

// RenewApplied is what a renewal of key in the locks bucket, refused for
// revision rev, finds: the key's later revision holding member (applied),
// or that the key is gone or someone else's (refused).
func RenewApplied(c *Coordinator, key, member string, rev uint64) (nrev uint64, applied, refused bool) {
	nrev, o := c.applied(c.locks, key, member, rev, time.Now().Add(c.cfg.opTimeout))
	return nrev, o == renewApplied, o == renewRefused
}

// TailHolds reports whether the tail of q (a queue of this package)
// holds the message at offset.
func TailHolds(q ferry.Queue, offset int64) bool {
	qq := q.(*queue)
	qq.mu.Lock()
	defer qq.mu.Unlock()
	for _, e := range qq.tail {
		if int64(e.seq)-1 == offset {
			return true
		}
	}
	return false
}

// RenewUnseen renews the member key of s (a session of this package), or
// with queue ≥ 0 the lock key of its lease of queue, as a renewal whose
// reply was lost would: the key's revision moves on, the session's
// record of it does not.
func RenewUnseen(ctx context.Context, s ferry.Session, queue int) error {
	ss := s.(*session)
	ss.mu.Lock()
	kv, key, rev := ss.c.members, ss.key, ss.rev
	if queue >= 0 {
		l := ss.leases[queue]
		kv, key, rev = ss.c.locks, l.key, l.rev
	}
	ss.mu.Unlock()
	_, err := kv.Update(ctx, key, ss.nonce, rev)
	return err
}

// StreamOf names the stream of q (a queue of this package).
func StreamOf(q ferry.Queue) string { return q.(*queue).stream }

// BacklogServed is how many messages Reads of q (a queue of this
// package) were served by a backlog reader (backlog.go).
func BacklogServed(q ferry.Queue) int64 { return q.(*queue).blServed.Load() }

// StreamName is the name of the stream of queue q of topic under prefix.
func StreamName(prefix, topic string, q int) string { return streamName(prefix, topic, q) }
