package natsstore

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/nats-io/nats.go/jetstream"
)

// The backlog reader: a Read of a backlog is a direct batch get, a round
// trip whose every message the server answers with six headers of its
// own, and a consumer reads one batch at a time; the read-ahead
// (readahead.go) overlaps the round trips, but a drain still ran at
// 0.16-0.47 × a raw pull consumer (issue 30, item 4), the time going in
// the gets' headers (built by the server, parsed by the client) and in
// waiting for them. So once a Read got a full batch from the server with
// more known behind it, the queue starts an ordered consumer of its
// stream at the next offset, which the server pushes the backlog to,
// flow-controlled by its pull requests: a goroutine of the queue takes
// each message and keeps it as stored, up to backlogKeep messages
// (backlogBytes bytes) ahead of the Reads, waiting for them to take some
// while it holds that many. A Read at the offset the backlog reader is at
// (or a little past it) is served what it holds, decoding it; a Read
// elsewhere (a seek far away) stops it.
//
// A message it holds is served only while it is surely still in the
// stream, by the read-ahead's rules (see goodAheadLocked): pushed less
// than tailFresh ago (and a quarter of MaxAge), at or above the oldest
// offset known, within MaxMessages of the end known (each push tells
// the end: the consumer's pending count), and on a queue with a byte
// limit, no write seen since it was pushed. When a rule fails, the Read
// asks the stream's leader for its first sequence: a message at or above
// it is there (retention cuts only below it), and what the reader holds
// is good again from then on; one below it (a retention cut) stops the
// reader and the Read asks the server as before, which tells
// ErrOffsetOutOfRange. Where the reader cannot serve (it could not start,
// the consumer ended, a gap in what it was pushed, nothing pushed within
// backlogWait), a Read gets as before, with the read-ahead.
//
// The reader stops tailIdle after the last Read it served. At the end of
// the queue it is pushed each new message, as the tail is, so the Reads
// waiting there while it runs need no tail.

const (
	backlogKeep  = 2048                  // the most messages the reader holds ahead of the Reads
	backlogBytes = 8 << 20               // and bytes (one message may exceed it)
	backlogPull  = 1024                  // the messages one pull request of its consumer asks for (512: the Reads waited on its pulls)
	backlogWait  = 50 * time.Millisecond // how long a Read waits for the reader to be pushed what it reads
	backlogRetry = time.Second           // after a reader failed, Reads read ahead by gets for this long

	backlogStampReuse = 64 // the most pushes with more behind stamped by one clock read
)

// backlog is a running backlog reader; the queue's mu guards its fields
// but cancel.
type backlog struct {
	head   int64              // the offset of buf[0] (where the Reads are)
	buf    []backlogEntry     // from head on, contiguous: a window of arr
	arr    []backlogEntry     // the array buf is in, from its start (see keepLocked)
	bytes  int                // the bodies' bytes in buf
	got    chan struct{}      // closed when buf grows while a Read waits, or the reader ends
	wants  bool               // a Read waits on got
	stamp  time.Time          // the clock read for the latest pushes (see keepPushed)
	reuses int                // pushes stamped since stamp was read
	room   chan struct{}      // the Reads took some (1-buffered)
	ended  bool               // the reader ended: it holds what it holds, no more
	failed bool               // it ended for a failure (not a stop)
	cancel context.CancelFunc // stops the reader
	idle   *time.Timer        // stops it tailIdle after the last Read it served
}

// backlogEntry is one message the reader was pushed, as it was stored:
// the Read it serves decodes it (see fromBacklog), so that the
// consumer's goroutine, which its pulls wait on, only keeps it.
type backlogEntry struct {
	data []byte    // the record's data (nats.go gives each message its own)
	off  int64     // its offset
	at   time.Time // when it was pushed, or last known to be in the stream
	next int64     // the end known then
}

// startBacklogLocked starts a backlog reader at offset from, unless one
// runs, one failed within backlogRetry, or Close began; it reports
// whether one runs. q.mu is held.
func (q *queue) startBacklogLocked(from int64) bool {
	if q.bl != nil {
		return true
	}
	if q.noAhead || time.Since(q.blFailed) < backlogRetry {
		return false
	}
	ctx, cancel := context.WithCancel(q.ctx)
	b := &backlog{head: from, got: make(chan struct{}), room: make(chan struct{}, 1), cancel: cancel}
	b.idle = time.AfterFunc(tailIdle, cancel) // each Read it serves puts it off
	q.bl = b
	q.dropAheadLocked()
	q.aheadWG.Go(func() { q.runBacklog(ctx, b, from) })
	return true
}

// stopBacklogLocked stops the backlog reader, if one runs; q.mu is held.
func (q *queue) stopBacklogLocked() {
	if q.bl != nil {
		q.bl.cancel()
		q.bl = nil
	}
}

// endBacklogLocked marks b ended (failed or not) and wakes the Reads
// waiting on it; q.mu is held.
func (q *queue) endBacklogLocked(b *backlog, failed bool) {
	if b.ended {
		return
	}
	b.ended, b.failed = true, failed
	if failed {
		q.blFailed = time.Now()
	}
	close(b.got)
}

// runBacklog is the backlog reader's goroutine: it runs an ordered
// consumer from offset from on until ctx ends (a stop, Close, idleness),
// the consumer fails, or it is pushed a message past a gap.
func (q *queue) runBacklog(ctx context.Context, b *backlog, from int64) {
	defer b.idle.Stop()
	defer b.cancel()
	var broke atomic.Bool // a push the reader cannot keep (a gap, say)
	failed := true
	defer func() {
		q.mu.Lock()
		q.endBacklogLocked(b, failed)
		if q.bl == b && len(b.buf) == 0 {
			q.bl = nil
		}
		q.mu.Unlock()
	}()
	sctx, scancel := context.WithTimeout(ctx, q.s.cfg.opTimeout)
	cons, err := q.s.js.OrderedConsumer(sctx, q.stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   uint64(from) + 1,
	})
	scancel()
	if err != nil {
		failed = ctx.Err() == nil
		return
	}
	// The handler waits while the reader holds backlogKeep messages: the
	// consumer asks for no more meanwhile (flow control by its pulls).
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if !q.keepPushed(ctx, b, m) && ctx.Err() == nil {
			broke.Store(true)
			b.cancel()
		}
	}, jetstream.PullMaxMessagesWithBytesLimit(backlogPull, max(backlogBytes, 2*int(q.s.js.Conn().MaxPayload()))))
	if err != nil {
		failed = ctx.Err() == nil
		return
	}
	closed := cc.Closed()
	select {
	case <-ctx.Done(): // a stop, idleness, Close, or a push it cannot keep
		failed = broke.Load()
	case <-closed: // the consumer ended
	}
	cc.Stop()
	<-closed
}

// keepPushed keeps msg in b, first waiting while b holds backlogKeep
// messages (or backlogBytes); false ends the reader: ctx ended, or msg
// is past a gap (a retention cut).
func (q *queue) keepPushed(ctx context.Context, b *backlog, msg jetstream.Msg) bool {
	seq, pending, ok := ackSeqPending(msg.Reply())
	if !ok {
		md, err := msg.Metadata()
		if err != nil {
			return false
		}
		seq, pending = md.Sequence.Stream, md.NumPending
	}
	off := int64(seq) - 1
	data := msg.Data()
	size := len(data)
	for {
		if ctx.Err() != nil {
			return false
		}
		q.mu.Lock()
		q.advanceLocked(off + 1 + int64(pending))
		want := b.head + int64(len(b.buf))
		switch {
		case b.ended:
			q.mu.Unlock()
			return false
		case off < want:
			q.mu.Unlock()
			return true // the Reads are past it
		case off > want:
			q.mu.Unlock()
			return false // a gap: gone, a get tells
		case len(b.buf) < backlogKeep && (b.bytes+size <= backlogBytes || len(b.buf) == 0):
			// A push with more behind it (a backlog, pushed in bursts)
			// takes the clock read for an earlier one, up to
			// backlogStampReuse times: a stamp earlier than the push only
			// makes the freshness rules (pushedGoodLocked) see the
			// message older than it is, stricter, never laxer.
			if pending == 0 || b.reuses >= backlogStampReuse || b.stamp.IsZero() {
				b.stamp, b.reuses = time.Now(), 0
			}
			b.reuses++
			b.keepLocked(backlogEntry{data: data, off: off, at: b.stamp, next: q.next})
			b.bytes += size
			if b.wants {
				b.wants = false
				close(b.got)
				b.got = make(chan struct{})
			}
			q.mu.Unlock()
			return true
		}
		q.mu.Unlock()
		select {
		case <-b.room:
		case <-ctx.Done():
			return false
		}
	}
}

// keepLocked appends e to b.buf. The Reads take from buf's front, so buf
// slides along arr: when it reaches arr's end, it moves back to arr's
// start if it fills at most half of arr, and grows (a new arr) if not;
// an empty buf starts again at arr's start (see dropLocked). So a reader
// keeping up with its pushes reuses one array instead of growing a new
// one each time the Reads empty it. The queue's mu is held.
func (b *backlog) keepLocked(e backlogEntry) {
	if len(b.buf) == cap(b.buf) && len(b.buf) > 0 && len(b.buf) <= cap(b.arr)/2 {
		n := copy(b.arr[:cap(b.arr)], b.buf)
		clear(b.arr[n:cap(b.arr)]) // what moved, at its old place
		b.buf = b.arr[:n]
	}
	if len(b.buf) == 0 {
		b.buf = b.arr[:0]
	}
	b.buf = append(b.buf, e)
	if cap(b.buf) > cap(b.arr) { // grown: a new array, buf at its start
		b.arr = b.buf[:0]
	}
}

// dropLocked drops buf's first n entries; the queue's mu is held.
func (b *backlog) dropLocked(n int) {
	clear(b.buf[:n])
	b.buf = b.buf[n:]
	if len(b.buf) == 0 {
		b.buf = b.arr[:0]
	}
}

// ackSeqPending reads a pushed message's stream sequence and the count
// pending behind it from its reply subject, as [jetstream.Msg.Metadata]
// does, without building the metadata: "$JS.ACK.<stream>.<consumer>.
// <delivered>.<sseq>.<cseq>.<time>.<pending>", or with "<domain>.<account
// hash>." after "$JS.ACK." and more tokens after <pending>. ok is false
// for another form (the caller asks Metadata).
func ackSeqPending(reply string) (seq, pending uint64, ok bool) {
	rest, found := strings.CutPrefix(reply, "$JS.ACK.")
	if !found {
		return 0, 0, false
	}
	var tok [9]string // the tokens after "$JS.ACK.", up to <pending> of the longer form
	n := 0
	for n < len(tok) {
		t, r, more := strings.Cut(rest, ".")
		tok[n] = t
		n++
		rest = r
		if !more {
			break
		}
	}
	switch {
	case n == 7: // the short form (the loop ended at its last token)
		seq, ok = parseSeq(tok[3])
		if ok {
			pending, ok = parseSeq(tok[6])
		}
	case n == 9: // the long form, <pending> the 9th
		seq, ok = parseSeq(tok[5])
		if ok {
			pending, ok = parseSeq(tok[8])
		}
	}
	return seq, pending, ok
}

// parseSeq parses a decimal sequence or count; false for anything else.
func parseSeq(s string) (uint64, bool) {
	if s == "" || len(s) > 20 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' || v > (math.MaxUint64-uint64(c-'0'))/10 {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// fromBacklog serves a Read at offset from what the backlog reader holds:
// 0 if there is none to serve (the Read gets). It waits up to
// backlogWait for the reader to be pushed offset; the caller knows
// offset is below the end.
func (q *queue) fromBacklog(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) int {
	waited, checked := false, false
	for {
		q.mu.Lock()
		b := q.bl
		switch {
		case b == nil:
			q.mu.Unlock()
			return 0
		case offset < b.head || offset > b.head+int64(len(b.buf))+backlogKeep: // a seek
			q.stopBacklogLocked()
			q.mu.Unlock()
			return 0
		}
		b.idle.Reset(tailIdle)
		q.trimBacklogLocked(b, offset)
		if len(b.buf) > 0 {
			if !q.pushedGoodLocked(&b.buf[0]) {
				q.mu.Unlock()
				if checked || !q.recheckBacklog(ctx, b, offset) {
					return 0
				}
				checked = true
				continue
			}
			n := min(len(dst), readBatch, len(b.buf))
			var raw [readBatch]backlogEntry
			for i := range n {
				raw[i] = b.buf[i]
				b.bytes -= len(raw[i].data)
			}
			b.dropLocked(n)
			b.head += int64(n)
			signal(b.room)
			q.mu.Unlock()
			n = q.decodeBacklog(b, raw[:n], dst)
			q.blServed.Add(int64(n))
			return n
		}
		if b.ended {
			if q.bl == b {
				q.bl = nil
			}
			q.mu.Unlock()
			return 0
		}
		if waited {
			q.mu.Unlock()
			return 0
		}
		got := b.got
		b.wants = true
		q.mu.Unlock()
		waited = true
		t := time.NewTimer(backlogWait)
		select {
		case <-got:
		case <-t.C:
		case <-ctx.Done():
		case <-q.done:
		}
		t.Stop()
	}
}

// decodeBacklog decodes raw, the records b served, into dst and returns
// how many it decoded: all, or none if one is undecodable, which stops b
// (the Read gets them instead, and tells).
func (q *queue) decodeBacklog(b *backlog, raw []backlogEntry, dst []*ferry.EnhancedMessage) int {
	for i, e := range raw {
		m, _, err := codec.Decode(e.data)
		if err != nil {
			clear(dst[:i])
			q.mu.Lock()
			if q.bl == b {
				q.stopBacklogLocked()
			}
			q.mu.Unlock()
			return 0
		}
		m.Queue, m.Offset = q.id.Queue, e.off
		dst[i] = m
	}
	return len(raw)
}

// trimBacklogLocked drops what b holds below offset, for a Read at
// offset (at or past b's head); q.mu is held.
func (q *queue) trimBacklogLocked(b *backlog, offset int64) {
	k := int(min(offset-b.head, int64(len(b.buf))))
	for i := range k {
		b.bytes -= len(b.buf[i].data)
	}
	b.dropLocked(k)
	b.head = offset
	if k > 0 {
		signal(b.room)
	}
}

// pushedGoodLocked reports whether e is surely still in the stream (see
// the top of this file); q.mu is held.
func (q *queue) pushedGoodLocked(e *backlogEntry) bool {
	fresh := tailFresh
	if age := q.meta.Retention.MaxAge; age > 0 {
		fresh = min(fresh, age/4)
	}
	off := e.off
	switch {
	case time.Since(e.at) > fresh, off < q.oldest:
		return false
	case q.sc.MaxMsgs > 0 && off < q.next-q.sc.MaxMsgs:
		return false
	case q.sc.MaxBytes > 0 && q.next != e.next:
		return false
	}
	return true
}

// recheckBacklog asks the stream's leader for its first sequence, for a
// Read at offset that b holds but may be gone: if offset is still there,
// what b holds is good as of now (true); if not, or the server does not
// answer, the reader stops.
func (q *queue) recheckBacklog(ctx context.Context, b *backlog, offset int64) bool {
	err := q.boundedRefresh(ctx)
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil || offset < q.oldest || q.bl != b || b.head != offset {
		if q.bl == b {
			q.stopBacklogLocked()
		}
		return false
	}
	now := time.Now()
	for i := range b.buf {
		b.buf[i].at, b.buf[i].next = now, q.next
	}
	return true
}

// backlogLive reports whether a backlog reader runs (Reads at the end
// are woken by its pushes).
func (q *queue) backlogLive() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bl != nil && !q.bl.ended
}
