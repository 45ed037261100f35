package natsstore

import (
	"context"
	"errors"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// Read-ahead: a Read of a backlog is one direct batch get, a round trip,
// and a consumer reads one batch at a time, so a drain ran at one batch
// per round trip (issue 30, item 4: 0.15-0.2 × a raw pull consumer,
// whose server pushes while the client handles). So once a Read got a
// full batch from the server with more known behind it, the queue asks
// for the next aheadBatch messages before anyone reads them, aheadDepth
// asks in flight, each one taken up again as the Reads consume one: the
// next Reads at those offsets are served what came.
//
// A message got ahead is served only while it is as good as a get's:
// asked less than tailFresh ago (and a quarter of MaxAge), at or above
// the oldest offset known and within MaxMessages of the end known; on a
// queue with a byte limit, only while no write was seen since it was
// asked (it could have pushed it out). A Read elsewhere (a seek) drops
// what was got ahead.

const (
	aheadBatch = 512
	aheadDepth = 2
)

// ahead is one ask of the read-ahead: the messages from offset from on.
type ahead struct {
	from int64
	at   time.Time // when it was asked
	next int64     // the end known then
	done chan struct{}
	msgs []*ferry.EnhancedMessage // set before done closes; what is left to serve
	err  error
}

// startAheadLocked asks for the aheadBatch messages from offset from on, if
// the end known is beyond it; q.mu is held.
func (q *queue) startAheadLocked(from int64) {
	if from >= q.next || q.noAhead {
		return
	}
	a := &ahead{from: from, at: time.Now(), next: q.next, done: make(chan struct{})}
	q.ahead = append(q.ahead, a)
	want := int(min(int64(aheadBatch), q.next-from))
	q.aheadWG.Go(func() {
		defer close(a.done)
		ctx, cancel := context.WithTimeout(q.ctx, q.s.cfg.directTry()) // none: the Reads get
		defer cancel()
		a.msgs, a.err = q.getAhead(ctx, from, want)
	})
}

// topUpLocked keeps aheadDepth asks in flight after the last one; q.mu
// is held.
func (q *queue) topUpLocked() {
	for len(q.ahead) > 0 && len(q.ahead) < aheadDepth {
		last := q.ahead[len(q.ahead)-1]
		end := last.from + int64(want(last))
		if end >= q.next {
			return
		}
		n := len(q.ahead)
		q.startAheadLocked(end)
		if len(q.ahead) == n {
			return
		}
	}
}

// want is how many messages a asked for: aheadBatch, or up to the end
// known when it was asked.
func want(a *ahead) int { return int(min(int64(aheadBatch), a.next-a.from)) }

// dropAheadLocked forgets what was got ahead; asks in flight finish
// unread. q.mu is held.
func (q *queue) dropAheadLocked() { q.ahead = nil }

// fromAhead serves a Read at offset from what was got ahead: 0 if there
// is none for offset (any got for other offsets is dropped).
func (q *queue) fromAhead(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) int {
	q.mu.Lock()
	if len(q.ahead) == 0 {
		q.mu.Unlock()
		return 0
	}
	a := q.ahead[0]
	if a.from != offset {
		q.dropAheadLocked()
		q.mu.Unlock()
		return 0
	}
	q.mu.Unlock()
	select {
	case <-a.done:
	case <-ctx.Done():
		return 0 // the get Read falls back on tells
	case <-q.done:
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ahead) == 0 || q.ahead[0] != a {
		return 0 // dropped meanwhile
	}
	if a.err != nil || len(a.msgs) == 0 || !q.goodAheadLocked(a) {
		q.dropAheadLocked()
		return 0
	}
	n := copy(dst[:min(len(dst), readBatch)], a.msgs)
	a.msgs = a.msgs[n:]
	if len(a.msgs) > 0 {
		q.ahead[0] = &ahead{from: a.from + int64(n), at: a.at, next: a.next, done: a.done, msgs: a.msgs}
	} else {
		q.ahead = q.ahead[1:]
		if len(q.ahead) == 0 {
			q.startAheadLocked(a.from + int64(want(a)))
		}
	}
	q.topUpLocked()
	return n
}

// goodAheadLocked reports whether what a holds is surely still in the
// stream (see the top of this file); q.mu is held.
func (q *queue) goodAheadLocked(a *ahead) bool {
	fresh := tailFresh
	if age := q.meta.Retention.MaxAge; age > 0 {
		fresh = min(fresh, age/4)
	}
	switch {
	case time.Since(a.at) > fresh, a.from < q.oldest:
		return false
	case q.sc.MaxMsgs > 0 && a.from < q.next-q.sc.MaxMsgs:
		return false
	case q.sc.MaxBytes > 0 && q.next != a.next:
		return false
	}
	return true
}

// getAhead gets up to n messages from offset on, contiguous; fewer when
// the stream holds fewer there.
func (q *queue) getAhead(ctx context.Context, offset int64, n int) ([]*ferry.EnhancedMessage, error) {
	it, err := jetstreamext.GetBatch(ctx, q.s.js, q.stream, n, jetstreamext.GetBatchSeq(uint64(offset)+1))
	if err != nil {
		return nil, err
	}
	out := make([]*ferry.EnhancedMessage, 0, n)
	for raw, err := range it {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		if err != nil {
			break // serve what came
		}
		off := int64(raw.Sequence) - 1
		if off != offset+int64(len(out)) {
			break
		}
		m, _, err := codec.Decode(raw.Data)
		if err != nil {
			break // a get tells
		}
		m.Queue, m.Offset = q.id.Queue, off
		out = append(out, m)
		if len(out) == n {
			break
		}
	}
	return out, nil
}
