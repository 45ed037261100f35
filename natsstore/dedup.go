package natsstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// Deduplication by [ferry.Message].DedupKey, on JetStream's own: a
// message with a key is published with the Nats-Msg-Id "k:<token>" (the
// token is the key's SHA-256, base64url), on the subject
// "<queue subject>.k.<token>", into a stream whose duplicate window is
// the topic's. A single message the stream had stored is acknowledged as
// a duplicate with the first copy's sequence; a get of that copy gives
// its ID and store time.
//
// An atomic batch (nats-server v2.15, jetstream_batching.go) is refused
// whole when one of its Nats-Msg-Ids is in the stream's window or twice
// in the batch (10201, naming neither the message nor the copy), and
// nothing of it is stored. So a Write drops the later messages of a
// batch that carry a key an earlier one carries before it publishes; on
// 10201 it gets the last message of each key's subject in one direct get
// (which is why a keyed message has a subject of its own): a copy stored
// within the window is a duplicate, dropped from the batch, reported at
// the copy; a copy with the Write's own ID means an earlier try of this
// Write stored the batch. Then the rest is published again, as one atomic
// batch still.

// keyIDPrefix starts the Nats-Msg-Id of a message stored under its key;
// a ferry.MessageID's is 32 hex digits.
const keyIDPrefix = "k:"

// minDupWindow is the shortest duplicate window JetStream takes.
const minDupWindow = 100 * time.Millisecond

// dedupWindowOf is the window a queue of meta deduplicates over, zero
// for [ferry.DedupOff].
func dedupWindowOf(meta ferry.TopicMeta) time.Duration {
	if w := meta.Normalized().DedupWindow; w > 0 {
		return w
	}
	return 0
}

// DedupWindow implements [ferry.Deduplicator]: the topic's
// [ferry.TopicMeta].DedupWindow, zero for [ferry.DedupOff]. The stream
// remembers a key at least that long (its Duplicates, at least
// JetStream's 100 ms and at most the topic's MaxAge), and forgets it at
// the next turn of the server's purge timer, tens of milliseconds later:
// a key is stored again no sooner than the window, possibly a little
// later. The window lives on the servers (rebuilt from the stored
// messages when one restarts), so it holds for every process writing the
// queue.
func (q *queue) DedupWindow() time.Duration { return q.window }

// keyToken is the token of dedup key key in a subject and a Nats-Msg-Id.
func keyToken(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// keyed reports whether m is stored under its dedup key.
func (q *queue) keyed(m *ferry.EnhancedMessage) bool { return q.window > 0 && m.DedupKey != "" }

// natsMsgID is m's Nats-Msg-Id.
func (q *queue) natsMsgID(m *ferry.EnhancedMessage) string {
	if q.keyed(m) {
		return keyIDPrefix + keyToken(m.DedupKey)
	}
	return m.ID.String()
}

// natsMsg returns m as published: on the queue's subject with its
// MessageID as Nats-Msg-Id if withID, or under its key (always with its
// key's Nats-Msg-Id).
//
// Of the messages without a key in an atomic batch, only the first
// carries its Nats-Msg-Id: the stream stores a batch whole or not at
// all, so that one ID tells whether a try stored the batch (the stream
// refuses a retried batch whole, and the retry finds it by that ID: see
// resolveBatch and findAsync), and the others would only cost each
// record ~47 bytes and a header every reader decodes (nats.go parses
// every message's headers into a map), and the server the bookkeeping
// of an ID over the duplicate window. Records written before carry an
// ID each, which nothing reads but a retry looking for its own.
func (q *queue) natsMsg(m *ferry.EnhancedMessage, withID bool) *nats.Msg {
	if q.keyed(m) {
		tok := keyToken(m.DedupKey)
		return &nats.Msg{Subject: q.subject + ".k." + tok, Header: nats.Header{jetstream.MsgIDHeader: []string{keyIDPrefix + tok}}, Data: codec.Append(nil, m)}
	}
	h := make(nats.Header, 4) // room for the batch headers
	if withID {
		h[jetstream.MsgIDHeader] = []string{m.ID.String()}
	}
	return &nats.Msg{Subject: q.subject, Header: h, Data: codec.Append(nil, m)}
}

// plan is a Write's messages as it publishes them.
type plan struct {
	msgs  []*ferry.EnhancedMessage
	keep  []int       // the indexes in msgs of those to store, in order
	out   []*nats.Msg // keep's messages as published
	twin  []int       // twin[i] >= 0: msgs[i] carries the key of msgs[twin[i]], earlier; nil if none does
	keyed bool        // a message of keep is stored under its key
}

// newPlan stamps msgs (store time now) and plans their write: each
// message whose key an earlier one carries is that one's twin, not
// published.
func (q *queue) newPlan(msgs []*ferry.EnhancedMessage, now int64) *plan {
	p := &plan{msgs: msgs, keep: make([]int, 0, len(msgs)), out: make([]*nats.Msg, 0, len(msgs))}
	var seen map[string]int
	idGiven := false // an unkeyed message kept carries its Nats-Msg-Id (see natsMsg)
	for i, m := range msgs {
		m.Queue, m.Offset, m.StoreUnixNano = q.id.Queue, 0, now
		if q.keyed(m) {
			if j, ok := seen[m.DedupKey]; ok {
				if p.twin == nil {
					p.twin = make([]int, len(msgs))
					for k := range p.twin {
						p.twin[k] = -1
					}
				}
				p.twin[i] = j
				continue
			}
			if seen == nil {
				seen = make(map[string]int)
			}
			seen[m.DedupKey] = i
			p.keyed = true
		}
		p.keep = append(p.keep, i)
		p.out = append(p.out, q.natsMsg(m, !idGiven))
		idGiven = idGiven || !q.keyed(m)
	}
	return p
}

// stored stamps the offsets of the messages kept, stored from first on,
// and settles the twins.
func (p *plan) stored(first int64) {
	for j, i := range p.keep {
		p.msgs[i].Offset = first + int64(j)
	}
	p.settle()
}

// settle gives each twin the fields of the message whose key it carries.
func (p *plan) settle() {
	for i, j := range p.twin {
		if j >= 0 {
			m, o := p.msgs[i], p.msgs[j]
			m.Queue, m.Offset, m.ID, m.StoreUnixNano = o.Queue, o.Offset, o.ID, o.StoreUnixNano
		}
	}
}

// drop takes keep[j] out of the plan, a duplicate of orig (stored
// before).
func (p *plan) drop(j int, orig *ferry.EnhancedMessage) {
	m := p.msgs[p.keep[j]]
	m.Queue, m.Offset, m.ID, m.StoreUnixNano = orig.Queue, orig.Offset, orig.ID, orig.StoreUnixNano
	p.keep = slices.Delete(p.keep, j, j+1)
	p.out = slices.Delete(p.out, j, j+1)
}

// settleSingle tells what a single message the stream acknowledged as a
// duplicate of sequence last+1 is: stored by an earlier try of this
// Write (ours: its store time is taken), or a duplicate of another
// write's, dropped from p. unknown says an earlier try's outcome was
// unknown. A copy the stream no longer holds (dropped by its retention
// since) is ours if the message has no key or an earlier try may have
// stored it; otherwise it is reported as a duplicate at that offset with
// the message's own ID and store time, the copy's being gone.
func (q *queue) settleSingle(ctx context.Context, p *plan, last int64, unknown bool) (ours bool, err error) {
	m := p.msgs[p.keep[0]]
	gctx, gcancel := q.s.cfg.bound(ctx)
	orig, ok, err := q.leaderGet(gctx, uint64(last)+1)
	gcancel()
	switch {
	case err != nil && !q.keyed(m):
		return true, nil // its own copy: only the store time is missing
	case err != nil:
		return false, err
	case !ok && (!q.keyed(m) || unknown):
		return true, nil
	case !ok:
		orig = &ferry.EnhancedMessage{ID: m.ID, StoreUnixNano: m.StoreUnixNano, Queue: q.id.Queue, Offset: last}
	case orig.ID == m.ID:
		m.StoreUnixNano = orig.StoreUnixNano
		return true, nil
	}
	p.drop(0, orig)
	q.advance(last + 1)
	return false, nil
}

// resolveBatch settles a batch the stream refused as holding a
// Nats-Msg-Id it stored within its window (10201: nothing of it is
// stored). If an earlier try of this Write stored it, resolveBatch stamps
// the messages and returns true with the first offset. Otherwise it drops
// from p the messages whose key was stored within the window (each
// reported at its copy) and returns false: the rest is to be published
// again. A batch without keys that the stream holds no copy of after
// hint is an error.
func (q *queue) resolveBatch(ctx context.Context, p *plan, hint int64, unknown bool) (bool, int64, error) {
	ctx, cancel := q.s.cfg.bound(ctx)
	defer cancel()
	if p.keyed {
		ours, first, dropped, err := q.keyCopies(ctx, p)
		if err != nil || ours {
			return ours, first, err
		}
		if dropped {
			return false, 0, nil
		}
	}
	if unknown || !p.keyed {
		j := 0
		if p.keyed { // an unkeyed message: a key's copy would have been found
			j = slices.IndexFunc(p.keep, func(i int) bool { return !q.keyed(p.msgs[i]) })
		}
		if j >= 0 {
			off, at, err := q.locate(ctx, hint, p.out[j].Header.Get(jetstream.MsgIDHeader), p.msgs[p.keep[j]].ID, !p.keyed)
			if err == nil {
				for _, i := range p.keep {
					p.msgs[i].StoreUnixNano = at
				}
				first := off - int64(j)
				p.stored(first)
				q.advance(first + int64(len(p.keep)))
				return true, first, nil
			}
			if !errors.Is(err, errNotFound) || !p.keyed {
				return false, 0, err
			}
		}
	}
	// A key's copy is in the window but not yet where the direct get was
	// answered (a replica behind its leader), or only just beyond the
	// window (the server forgets a key at its purge timer's next turn):
	// ask again after a pause.
	select {
	case <-time.After(retryBackoff):
	case <-ctx.Done():
	case <-q.done:
	}
	return false, 0, nil
}

// keyCopies gets the last message stored under each key of p's kept
// messages: one with the ID of the message that carries its key means an
// earlier try stored p (ours, with the first offset); others stored
// within the window are duplicates, dropped from p.
func (q *queue) keyCopies(ctx context.Context, p *plan) (ours bool, first int64, dropped bool, err error) {
	pos := make(map[string]int, len(p.keep))
	subjects := make([]string, 0, len(p.keep))
	for j, i := range p.keep {
		if q.keyed(p.msgs[i]) {
			pos[p.out[j].Subject] = j
			subjects = append(subjects, p.out[j].Subject)
		}
	}
	it, err := jetstreamext.GetLastMsgsFor(ctx, q.s.js, q.stream, subjects)
	if err != nil {
		return false, 0, false, err
	}
	type dup struct {
		j    int
		orig *ferry.EnhancedMessage
	}
	var dups []dup
	now := time.Now()
	for raw, err := range it {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		if err != nil {
			return false, 0, false, err
		}
		j, ok := pos[raw.Subject]
		if !ok {
			continue
		}
		orig, _, err := codec.Decode(raw.Data)
		if err != nil {
			return false, 0, false, fmt.Errorf("message %d: %w", raw.Sequence, err)
		}
		orig.Queue, orig.Offset = q.id.Queue, int64(raw.Sequence)-1
		if orig.ID == p.msgs[p.keep[j]].ID {
			first = orig.Offset - int64(j)
			for _, i := range p.keep {
				p.msgs[i].StoreUnixNano = orig.StoreUnixNano
			}
			p.stored(first)
			q.advance(first + int64(len(p.keep)))
			return true, first, false, nil
		}
		if now.Sub(raw.Time) < q.window {
			dups = append(dups, dup{j, orig})
		}
	}
	slices.SortFunc(dups, func(a, b dup) int { return b.j - a.j }) // drop from the back
	for _, d := range dups {
		p.drop(d.j, d.orig)
		q.advance(d.orig.Offset + 1)
	}
	return false, 0, len(dups) > 0, nil
}

// isDupInProcess: a message with the Nats-Msg-Id is being stored (a
// proposal of a replicated stream not yet applied, 10158): ask again.
func isDupInProcess(err error) bool {
	code, _ := apiCode(err)
	return code == 10158
}
