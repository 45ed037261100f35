package ferry

import (
	"context"
	"errors"
	"math/rand/v2"
)

// Topics another broker sharing the storage deleted or created again
// (see TopicMeta.Incarnation): asking the storage again.

// replaced reports whether the send of m, which failed with *err, is
// worth making again: its topic's queue said ErrClosed while producer and
// broker are open, and the storage holds another incarnation of the
// topic (another broker deleted it and created it again), which is open
// now. When the storage holds no such topic, *err becomes
// ErrTopicNotFound. A closed queue stored nothing, so the send is made at
// most twice and stored at most once.
func (p *Producer) replaced(ctx context.Context, m *Message, err *error) bool {
	if m == nil {
		return false
	}
	t, nt, rerr := p.recheck(ctx, m.Topic, *err)
	if t == nil {
		return false
	}
	switch {
	case errors.Is(rerr, ErrTopicNotFound):
		*err = rerr
		return false
	case rerr != nil:
		return false
	}
	return nt != t
}

// recheck asks the storage about topic after a send to it failed with
// err, when err is ErrClosed while producer and broker are open (see
// replaced): t is the topic that was open (nil when recheck did
// nothing), nt the one open now, rerr what the storage said.
func (p *Producer) recheck(ctx context.Context, topic string, err error) (t, nt *topicState, rerr error) {
	if !errors.Is(err, ErrClosed) || p.closed.Load() || p.b.closed.Load() {
		return nil, nil, nil
	}
	t, ok := p.b.lookup(topic)
	if !ok {
		return nil, nil, nil
	}
	nt, rerr = p.b.refresh(ctx, t)
	return t, nt, rerr
}

// refresh looks topic t up in the storage again after one of its queues
// said ErrClosed while the broker is open: another broker sharing the
// storage may have deleted it (ErrTopicNotFound; t is dropped) or
// created it again (the new incarnation is opened and replaces t). It
// returns the topic open now: t itself when the storage holds the same
// incarnation (the error was not about the topic).
func (b *Broker) refresh(ctx context.Context, t *topicState) (*topicState, error) {
	name := t.meta.Name
	meta, err := b.storedTopic(ctx, name)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	cur, ok := b.lookup(name)
	if err != nil {
		if errors.Is(err, ErrTopicNotFound) && ok && cur == t {
			b.unpublish(name)
			t.stale.Store(true)
		}
		return nil, err
	}
	if !ok {
		cur = t
	}
	return b.adoptLocked(ctx, cur, meta.Normalized())
}

// adoptLocked makes the topic of meta, as the storage holds it, the one
// open: cur (nil when none is open) when it is the same incarnation, or
// a new topic replacing cur (which producers then leave, see stale).
// b.mu held.
func (b *Broker) adoptLocked(ctx context.Context, cur *topicState, meta TopicMeta) (*topicState, error) {
	if cur != nil && cur.meta.Incarnation == meta.Incarnation {
		return cur, nil
	}
	t, err := b.openTopic(ctx, meta)
	if err != nil {
		return nil, err
	}
	if cur != nil {
		cur.stale.Store(true)
	}
	b.publish(t)
	return t, nil
}

// newIncarnation returns a new topic incarnation (see
// [TopicMeta.Incarnation]): random, never zero.
func newIncarnation() uint64 { return rand.Uint64() | 1 }

// recheckBatch is recheck for the topics of a batch that failed with err:
// it is not sent again (a part of it may be stored), but the next send
// finds a topic another broker created again.
func (p *Producer) recheckBatch(ctx context.Context, msgs []*Message, err error) {
	if !errors.Is(err, ErrClosed) {
		return
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		if m != nil && !seen[m.Topic] {
			seen[m.Topic] = true
			p.recheck(ctx, m.Topic, err)
		}
	}
}
