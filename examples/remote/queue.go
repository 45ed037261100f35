package remote

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// Queue is the client of one queue on a [Server]: a [ferry.Queue] whose
// Write sends the messages, in Ferry's codec, to the server, which writes
// them to its storage's queue, and whose Read waits on the server for
// the next ones. It also implements [ferry.AsyncWriter] (writes begun
// while one call is in flight go together in the next, written as one
// batch where they can be), [ferry.OffsetsContexter], and
// [ferry.TryWriter] and [ferry.Releaser] (for topics with [ferry.Block]
// overflow).
//
// A Write is all or nothing on the server; a Write that fails with
// [ErrUnavailable], or whose ctx ends while it is in flight, may have
// been stored (the answer was lost), never half: as with any network
// store, a caller that retries it delivers at least once. A Queue is safe for concurrent use. Close is idempotent; it
// reports every pending WriteAsync and returns once its goroutine (the
// one sending WriteAsync's calls, started with the first) has exited.
type Queue struct {
	s     *Storage
	meta  ferry.TopicMeta
	id    ferry.QueueID
	query url.Values      // topic and queue, for every call
	ctx   context.Context // ends with Close
	stop  context.CancelFunc

	oldest, next atomic.Int64 // the offsets last heard of, never moving back

	amu      sync.Mutex // guards pending, sending and aclosed
	pending  []*asyncWrite
	sending  bool          // the sender goroutine is running
	aclosed  bool          // Close has begun: WriteAsync reports ErrClosed
	slots    chan struct{} // one per pending write that holds a place (bounds WriteAsync)
	sender   sync.WaitGroup
	closeOne sync.Once
}

var (
	_ ferry.Queue            = (*Queue)(nil)
	_ ferry.AsyncWriter      = (*Queue)(nil)
	_ ferry.OffsetsContexter = (*Queue)(nil)
	_ ferry.TryWriter        = (*Queue)(nil)
	_ ferry.Releaser         = (*Queue)(nil)
)

func newQueue(s *Storage, meta ferry.TopicMeta, i int) *Queue {
	ctx, stop := context.WithCancel(s.ctx)
	q := &Queue{
		s: s, meta: meta, id: ferry.QueueID{Topic: meta.Name, Queue: i},
		query: url.Values{"topic": {meta.Name}, "queue": {strconv.Itoa(i)}},
		ctx:   ctx, stop: stop,
		slots: make(chan struct{}, s.cfg.maxAsync),
	}
	return q
}

// ID returns the queue's identity.
func (q *Queue) ID() ferry.QueueID { return q.id }

// seen records offsets a call reported.
func (q *Queue) seen(oldest, next int64) {
	for v := q.oldest.Load(); oldest > v && !q.oldest.CompareAndSwap(v, oldest); v = q.oldest.Load() {
	}
	for v := q.next.Load(); next > v && !q.next.CompareAndSwap(v, next); v = q.next.Load() {
	}
}

func (q *Queue) opName(what string) string {
	return fmt.Sprintf("%s %s/%d", what, q.id.Topic, q.id.Queue)
}

// call makes a call on the queue; where the server has not opened it (it
// restarted), it opens it again and makes the call once more.
func (q *Queue) call(ctx context.Context, op, method string, query url.Values, body []byte) ([]byte, error) {
	b, err := q.s.call(ctx, q.ctx, op, method, query, body)
	var se *ServerError
	if !errors.As(err, &se) || se.Code != codeNotOpen {
		return b, err
	}
	var off offsetsResponse
	if err := q.s.control(ctx, q.ctx, op, mOpenQueue, nil, openRequest{Meta: q.meta, Queue: q.id.Queue}, &off); err != nil {
		return nil, err
	}
	return q.s.call(ctx, q.ctx, op, method, query, body)
}

func (q *Queue) withQuery(kv ...string) url.Values {
	v := make(url.Values, len(q.query)+len(kv)/2)
	for k, vs := range q.query {
		v[k] = vs
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// checkBatch is the error of a batch the server need not see: a nil
// message, or more bytes than one call carries.
func (q *Queue) checkBatch(op string, msgs []*ferry.EnhancedMessage) error {
	size := 0
	for i, m := range msgs {
		if m == nil {
			return &ferry.Error{Op: "remote " + q.opName(op), Err: fmt.Errorf("%w: message %d is nil", ferry.ErrInvalidMessage, i)}
		}
		size += codec.Size(m)
	}
	if size > maxBatchBytes {
		return &ferry.Error{Op: "remote " + q.opName(op), Err: fmt.Errorf("%w: %d bytes encoded, a call carries at most %d", ferry.ErrMessageTooLarge, size, maxBatchBytes)}
	}
	return nil
}

// Write sends msgs to the server, which writes them to its queue, and
// stamps them with what it stored (see [ferry.WritableQueue]).
func (q *Queue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	return q.write(ctx, "write", msgs, false)
}

// TryWrite is Write without waiting for room on a [ferry.Block] queue
// (see [ferry.TryWriter]); it waits for the server's answer for at most
// the op timeout ([WithOpTimeout]).
func (q *Queue) TryWrite(msgs []*ferry.EnhancedMessage) (int64, error) {
	ctx, cancel := context.WithTimeout(q.ctx, q.s.cfg.opTimeout)
	defer cancel()
	return q.write(ctx, "try write", msgs, true)
}

func (q *Queue) write(ctx context.Context, op string, msgs []*ferry.EnhancedMessage, try bool) (int64, error) {
	if ctx == nil {
		return 0, &ferry.Error{Op: "remote " + q.opName(op), Err: fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)}
	}
	if err := q.checkBatch(op, msgs); err != nil {
		return 0, err
	}
	res, err := q.send(ctx, op, [][]*ferry.EnhancedMessage{msgs}, try)
	if err != nil {
		return 0, err
	}
	return res[0].first, res[0].err
}

// send writes batches in one call and stamps the messages of those
// stored.
func (q *Queue) send(ctx context.Context, op string, batches [][]*ferry.EnhancedMessage, try bool) ([]writeResult, error) {
	query := q.query
	if try {
		query = q.withQuery("try", "1")
	}
	b, err := q.call(ctx, q.opName(op), mWrite, query, appendBatches(nil, batches))
	if err != nil {
		return nil, err
	}
	sizes := make([]int, len(batches))
	for i, bt := range batches {
		sizes[i] = len(bt)
	}
	res, oldest, next, err := decodeWriteResponse(b, sizes)
	if err != nil {
		return nil, &ferry.Error{Op: "remote " + q.opName(op), Err: err}
	}
	q.seen(oldest, next)
	for i, bt := range batches {
		if res[i].err != nil {
			continue
		}
		for j, m := range bt {
			m.Queue = q.id.Queue
			m.Offset = res[i].first + int64(j)
			m.StoreUnixNano = res[i].stored[j]
		}
	}
	return res, nil
}

// Read fills dst with messages from offset on, waiting on the server
// until there is one (see [ferry.ReadableQueue]). A Read that loses the
// server fails with [ErrUnavailable]; the next reconnects.
func (q *Queue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	op := q.opName("read")
	if ctx == nil {
		return 0, &ferry.Error{Op: "remote " + op, Err: fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)}
	}
	if q.ctx.Err() != nil {
		return 0, &ferry.Error{Op: "remote " + op, Err: ferry.ErrClosed}
	}
	if len(dst) == 0 {
		return 0, nil
	}
	n := min(len(dst), maxReadMessages)
	b, err := q.call(ctx, op, mRead, q.withQuery("offset", strconv.FormatInt(offset, 10), "max", strconv.Itoa(n)), nil)
	if err != nil {
		return 0, err
	}
	n, oldest, next, err := decodeReadResponse(b, dst[:n])
	if err != nil {
		return 0, &ferry.Error{Op: "remote " + op, Err: err}
	}
	q.seen(oldest, next)
	return n, nil
}

// OffsetsContext asks the server for the queue's offsets.
func (q *Queue) OffsetsContext(ctx context.Context) (oldest, next int64, err error) {
	var off offsetsResponse
	if err := q.callControl(ctx, "offsets", mOffsets, q.query, &off); err != nil {
		return 0, 0, err
	}
	q.seen(off.Oldest, off.Next)
	return q.oldest.Load(), q.next.Load(), nil
}

func (q *Queue) callControl(ctx context.Context, op, method string, query url.Values, resp any) error {
	b, err := q.call(ctx, q.opName(op), method, query, nil)
	if err != nil {
		return err
	}
	return unmarshalResponse(q.opName(op), b, resp)
}

// Offsets asks the server for the queue's offsets, for at most the op
// timeout ([WithOpTimeout]); if it gets no answer (or after Close) it
// returns the offsets it last heard of.
func (q *Queue) Offsets() (oldest, next int64) {
	ctx, cancel := context.WithTimeout(q.ctx, q.s.cfg.opTimeout)
	defer cancel()
	_, _, _ = q.OffsetsContext(ctx)
	return q.oldest.Load(), q.next.Load()
}

// Release tells the server's queue that the messages below offset are
// done with (see [ferry.Releaser]); it waits for at most the op timeout,
// and a Release that gets no answer is dropped (the next carries a
// higher offset).
func (q *Queue) Release(offset int64) {
	ctx, cancel := context.WithTimeout(q.ctx, q.s.cfg.opTimeout)
	defer cancel()
	_ = q.callControl(ctx, "release", mRelease, q.withQuery("offset", strconv.FormatInt(offset, 10)), nil)
}

// Close reports the pending WriteAsync writes (their outcome, or
// [ferry.ErrClosed]), ends the calls in flight and waits for the
// sender. It does not touch the server's queue, which other clients may
// use.
func (q *Queue) Close() error {
	q.closeOne.Do(func() {
		q.amu.Lock()
		q.aclosed = true
		q.amu.Unlock()
		q.stop()
		q.sender.Wait()
		// The sender has exited; what it left is reported here.
		q.amu.Lock()
		left := q.pending
		q.pending = nil
		q.amu.Unlock()
		for _, w := range left {
			w.done(0, &ferry.Error{Op: "remote " + q.opName("write"), Err: ferry.ErrClosed})
		}
		q.s.forget(q)
	})
	return nil
}
