package natsstore

import (
	"context"
	"sort"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/nats-io/nats.go/jetstream"
)

// The tail of a queue: an ordered consumer of its stream that runs only
// while Reads wait at the end. It wakes them, and it hands them the
// messages it is pushed, so that a woken Read returns without asking the
// server for them (a direct get: a round trip). It starts when a Read
// first waits at the end and stops tailIdle after the last Read that
// waited: a process that only writes to a queue, or reads it from
// behind, is pushed nothing.
//
// A message is served from the tail only while it is surely still in the
// stream: at or above the oldest offset known, within MaxMessages of the
// end known, within MaxBytes (over-estimated) of the end when the tail
// holds everything up to it, and pushed less than tailFresh ago (and a
// quarter of MaxAge). Otherwise, and for any message the tail does not
// hold, Read asks the server as before.

// tailKeep bounds the messages a queue's tail keeps.
const tailKeep = readBatch

// tailFresh bounds how long after it was pushed a message is served from
// the tail: the tail is for Reads woken by its push.
const tailFresh = 250 * time.Millisecond

// tailIdle is how long a tail runs after the last Read that waited.
const tailIdle = 10 * time.Second

// tailEntry is one message the tail was pushed.
type tailEntry struct {
	seq  uint64
	at   time.Time // when it was pushed
	size int64     // at least the bytes JetStream counts for it
	data []byte
}

// tailer is the queue's goroutine that owns its tail: idle until a Read
// waits at the end, then running until tailIdle after the last one, the
// consumer stops, or Close.
func (q *queue) tailer() {
	for {
		select {
		case <-q.done:
			return
		case <-q.tailWant:
		}
		cc, err := q.startTail()
		if err != nil {
			// The waiting Read still asks the leader every idleRefresh;
			// its next wait asks for a tail again.
			continue
		}
		q.runTail(cc)
	}
}

// startTail starts an ordered consumer of the stream from the end known,
// as the tail of a new generation.
func (q *queue) startTail() (jetstream.ConsumeContext, error) {
	ctx, cancel := context.WithTimeout(context.Background(), q.s.cfg.opTimeout)
	defer cancel()
	stop := context.AfterFunc(q.ctx, cancel) // Close ends the start
	defer stop()
	q.mu.Lock()
	q.tailGen++
	gen, from := q.tailGen, q.next
	q.tail = q.tail[:0]
	q.mu.Unlock()
	cons, err := q.s.js.OrderedConsumer(ctx, q.stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   uint64(from) + 1,
	})
	if err != nil {
		return nil, err
	}
	return cons.Consume(func(m jetstream.Msg) { q.pushed(gen, m) })
}

// runTail runs until no Read has waited for tailIdle, the consumer
// stops, or Close; then it ends the generation and stops the consumer.
func (q *queue) runTail(cc jetstream.ConsumeContext) {
	defer func() {
		q.mu.Lock()
		q.tailGen++ // pushes still on their way are not kept
		q.tail = q.tail[:0]
		q.mu.Unlock()
		cc.Stop()
		<-cc.Closed()
	}()
	idle := time.NewTimer(tailIdle)
	defer idle.Stop()
	for {
		select {
		case <-q.done:
			return
		case <-cc.Closed():
			return
		case <-q.tailWant: // running already
		case <-idle.C:
			since := time.Since(time.Unix(0, q.waited.Load()))
			if since >= tailIdle {
				return
			}
			idle.Reset(tailIdle - since)
		}
	}
}

// pushed keeps a message the tail of generation gen was pushed, and
// wakes the Reads waiting for it.
func (q *queue) pushed(gen uint64, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		return
	}
	seq := md.Sequence.Stream
	size := int64(len(m.Subject())+len(m.Data())) + 64 // JetStream's record overhead is below 64
	for k, vs := range m.Headers() {
		for _, v := range vs {
			size += int64(len(k) + len(v) + 4)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if gen == q.tailGen && (len(q.tail) == 0 || q.tail[len(q.tail)-1].seq < seq) {
		if len(q.tail) == 2*tailKeep {
			q.tail = q.tail[:copy(q.tail, q.tail[tailKeep:])]
		}
		q.tail = append(q.tail, tailEntry{seq: seq, at: time.Now(), size: size, data: m.Data()})
	}
	q.advanceLocked(int64(seq))
}

// fromTail decodes into dst the messages the tail holds from offset on,
// contiguous and surely still in the stream; 0 if there are none.
func (q *queue) fromTail(offset int64, dst []*ferry.EnhancedMessage) int {
	want := min(len(dst), readBatch)
	var datas [][]byte
	q.mu.Lock()
	seq := uint64(offset) + 1
	i := sort.Search(len(q.tail), func(i int) bool { return q.tail[i].seq >= seq })
	if i < len(q.tail) && q.tail[i].seq == seq && q.retained(i) {
		for j := i; j < len(q.tail) && len(datas) < want && q.tail[j].seq == seq; j++ {
			datas = append(datas, q.tail[j].data)
			seq++
		}
	}
	q.mu.Unlock()
	n := 0
	for _, d := range datas {
		m, _, err := codec.Decode(d)
		if err != nil {
			break // the server's copy tells (Read asks it)
		}
		m.Queue, m.Offset = q.id.Queue, offset+int64(n)
		dst[n] = m
		n++
	}
	return n
}

// retained reports whether the tail's entry i is surely still in the
// stream (see the top of this file); q.mu is held. Later entries are then
// too.
func (q *queue) retained(i int) bool {
	e := q.tail[i]
	off := int64(e.seq) - 1
	fresh := tailFresh
	if age := q.meta.Retention.MaxAge; age > 0 {
		fresh = min(fresh, age/4)
	}
	switch {
	case off < q.oldest, time.Since(e.at) > fresh:
		return false
	case q.sc.MaxMsgs > 0 && off < q.next-q.sc.MaxMsgs:
		return false
	case q.sc.MaxBytes > 0:
		last := q.tail[len(q.tail)-1]
		if int64(last.seq) < q.next || int64(len(q.tail)-i) != int64(last.seq-e.seq)+1 {
			return false // the tail does not hold all the bytes up to the end
		}
		bytes := int64(0)
		for _, e := range q.tail[i:] {
			bytes += e.size
		}
		return bytes <= q.sc.MaxBytes
	}
	return true
}
