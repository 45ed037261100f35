package natsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// MaxBatch is the most messages one Write stores: JetStream's limit on an
// atomic batch. A larger batch is [ferry.ErrMessageTooLarge].
const MaxBatch = 1000

// readBatch bounds the messages one Read asks the server for.
const readBatch = 256

// retryBackoff is the pause between two tries of a write whose outcome
// was unknown (a timeout, no responders during an election).
const retryBackoff = 50 * time.Millisecond

// queue is a [ferry.Queue] over one stream; offset = sequence − 1.
type queue struct {
	s       *Store
	id      ferry.QueueID
	meta    ferry.TopicMeta
	stream  string
	subject string
	relSubj string
	handle  jetstream.Stream
	sc      jetstream.StreamConfig // as asked for at open
	window  time.Duration          // the topic's dedup window; 0: off (dedup.go)

	done   chan struct{} // closed by Close
	ctx    context.Context
	cancel context.CancelFunc // cancels ctx: Close
	once   sync.Once
	wg     sync.WaitGroup // the tailer and the purger

	tailWant chan struct{}      // a Read waits at the end (1-buffered)
	waited   atomic.Int64       // unix ns of the last Read that waited at the end
	blServed atomic.Int64       // messages Reads were served by a backlog reader (a test hook)
	relSub   *nats.Subscription // Block: wakes writers when released
	relWake  chan struct{}      // Block: a release happened (1-buffered)
	purgeReq chan struct{}      // Block: purge up to released (1-buffered)

	mu       sync.Mutex // guards the fields below
	oldest   int64
	next     int64
	wake     chan struct{} // closed and replaced when next grows
	released int64
	tail     []tailEntry // the tail's latest messages, by sequence (tail.go)
	tailGen  uint64      // the tail's generation: pushes of another are not kept
	ahead    []*ahead    // the read-ahead's asks, by offset (readahead.go)
	bl       *backlog    // the backlog reader (backlog.go); nil: none
	blFailed time.Time   // when a backlog reader last failed
	noAhead  bool        // Close began: no more asks, no backlog reader
	aheadWG  sync.WaitGroup

	// Asynchronous writes (write_async.go). amu guards the fields below;
	// awg counts the acker.
	amu        sync.Mutex
	inflight   []*inflight // published, not yet reported, oldest first
	acking     bool        // the acker runs
	deferred   int         // writes in inflight the acker writes itself
	recovering bool        // the acker settles a stopped pipeline: new writes are deferred
	aclosed    bool        // Close began: WriteAsync refuses
	awg        sync.WaitGroup
}

var (
	_ ferry.Queue     = (*queue)(nil)
	_ ferry.TryWriter = (*queue)(nil)
	_ ferry.Releaser  = (*queue)(nil)

	_ ferry.OffsetsContexter = (*queue)(nil)
	_ ferry.Deduplicator     = (*queue)(nil)
)

// streamConfig maps meta's retention onto a stream.
func (s *Store) streamConfig(meta ferry.TopicMeta, name, subject string) jetstream.StreamConfig {
	r := meta.Normalized().Retention
	sc := jetstream.StreamConfig{
		Name:               name,
		Subjects:           []string{subject, subject + ".k.*"},
		Storage:            s.cfg.storage,
		Replicas:           s.cfg.replicas,
		MaxMsgs:            -1,
		MaxBytes:           -1,
		MaxAge:             r.MaxAge,
		Discard:            jetstream.DiscardOld,
		Duplicates:         s.cfg.dupWindow,
		AllowDirect:        true,
		AllowAtomicPublish: true,
	}
	if r.MaxMessages > 0 {
		sc.MaxMsgs = r.MaxMessages
	}
	if r.MaxBytes > 0 {
		msgs := r.MaxMessages
		if msgs <= 0 {
			msgs = ferry.DefaultRetentionMessages
		}
		sc.MaxBytes = r.MaxBytes + s.cfg.recordOverhead*msgs
	}
	if r.Overflow == ferry.Block {
		sc.Discard = jetstream.DiscardNew
	}
	if w := dedupWindowOf(meta); w > 0 {
		sc.Duplicates = max(w, minDupWindow)
	}
	if r.MaxAge > 0 && sc.Duplicates > r.MaxAge {
		sc.Duplicates = r.MaxAge
	}
	return sc
}

// OpenQueue implements [ferry.Storage]: it creates the queue's stream if
// absent (updating its limits to meta's otherwise). The queue's goroutine
// runs an ordered consumer of the stream while Reads wait at its end
// (tail.go).
func (s *Store) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "natsstore: open queue", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return nil, &ferry.Error{Op: "natsstore: open queue", Err: err}
	}
	if i < 0 || i >= meta.Queues {
		return nil, &ferry.Error{Op: "natsstore: open queue", Err: fmt.Errorf("%w: queue %d of %d", ferry.ErrInvalidTopic, i, meta.Queues)}
	}
	if s.isClosed() {
		return nil, &ferry.Error{Op: "natsstore: open queue", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	name := streamName(s.cfg.prefix, meta.Name, i)
	q := &queue{
		s: s, id: ferry.QueueID{Topic: meta.Name, Queue: i}, meta: meta.Normalized(),
		stream: name, subject: s.cfg.prefix + ".q." + name, relSubj: s.cfg.prefix + ".rel." + name,
		done: make(chan struct{}), wake: make(chan struct{}), released: -1, tailWant: make(chan struct{}, 1),
		window: dedupWindowOf(meta),
	}
	q.sc = s.streamConfig(meta, name, q.subject)
	h, err := s.openStream(ctx, q.sc)
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: open queue %s: stream %s", q.id, name), Err: err}
	}
	q.handle = h
	info, err := askExisting(ctx, s.cfg, func(ctx context.Context) (*jetstream.StreamInfo, error) { return h.Info(ctx) })
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: open queue %s", q.id), Err: err}
	}
	q.oldest, q.next = offsetsOf(info.State)
	if q.meta.Retention.Overflow == ferry.Block {
		q.relWake = make(chan struct{}, 1)
		q.purgeReq = make(chan struct{}, 1)
		q.relSub, err = s.js.Conn().Subscribe(q.relSubj, func(*nats.Msg) { signal(q.relWake) })
		if err != nil {
			return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: open queue %s: subscribe", q.id), Err: err}
		}
	}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	q.wg.Go(q.tailer)
	if q.purgeReq != nil {
		q.wg.Go(q.purger)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = q.Close()
		return nil, &ferry.Error{Op: "natsstore: open queue", Err: ferry.ErrClosed}
	}
	s.queues[q] = struct{}{}
	s.mu.Unlock()
	return q, nil
}

func offsetsOf(st jetstream.StreamState) (oldest, next int64) {
	next = int64(st.LastSeq)
	if st.Msgs == 0 || st.FirstSeq == 0 {
		return next, next
	}
	return int64(st.FirstSeq) - 1, next
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// advance records that offsets below next exist and wakes readers.
func (q *queue) advance(next int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.advanceLocked(next)
}

// advanceLocked is advance; q.mu is held.
func (q *queue) advanceLocked(next int64) {
	if next > q.next {
		q.next = next
		close(q.wake)
		q.wake = make(chan struct{})
	}
}

// learn merges fresh offsets, never moving either back.
func (q *queue) learn(oldest, next int64) {
	q.advance(next)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.oldest = max(q.oldest, min(oldest, q.next))
}

func (q *queue) isClosed() bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// ID implements [ferry.Queue].
func (q *queue) ID() ferry.QueueID { return q.id }

// Offsets implements [ferry.Queue]: it asks the server (bounded by the op
// timeout), since other processes write and retention drops; on an error
// or after Close it returns what it last knew.
func (q *queue) Offsets() (oldest, next int64) {
	if !q.isClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), q.s.cfg.opTimeout)
		info, err := q.handle.Info(ctx)
		cancel()
		if err == nil {
			q.learn(offsetsOf(info.State))
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.oldest, q.next
}

// OffsetsContext implements [ferry.OffsetsContexter]: it asks the server
// as Offsets does, but under ctx (bounded by the op timeout unless ctx
// has a deadline), and returns the error instead of what it last knew:
// the consumer's take and reset, Lag and ResetGroup call it, so a
// caller's ctx ends their wait and a server that does not answer is an
// error, not stale offsets. After Close it is [ferry.ErrClosed].
func (q *queue) OffsetsContext(ctx context.Context) (oldest, next int64, err error) {
	if err := checkContext(ctx); err != nil {
		return 0, 0, &ferry.Error{Op: fmt.Sprintf("natsstore: offsets %s", q.id), Err: err}
	}
	if q.isClosed() {
		return 0, 0, &ferry.Error{Op: fmt.Sprintf("natsstore: offsets %s", q.id), Err: ferry.ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, &ferry.Error{Op: fmt.Sprintf("natsstore: offsets %s", q.id), Err: err}
	}
	if err := q.boundedRefresh(ctx); err != nil {
		return 0, 0, &ferry.Error{Op: fmt.Sprintf("natsstore: offsets %s", q.id), Err: err}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.oldest, q.next, nil
}

// boundedRefresh is refresh bounded by the op timeout unless ctx has a
// deadline: a request whose server dies gets no reply.
func (q *queue) boundedRefresh(ctx context.Context) error {
	ctx, cancel := q.s.cfg.bound(ctx)
	defer cancel()
	return q.refresh(ctx)
}

func (q *queue) refresh(ctx context.Context) error {
	info, err := q.handle.Info(ctx)
	if err != nil {
		return err
	}
	q.learn(offsetsOf(info.State))
	return nil
}

// Read implements [ferry.Queue]: what the tail was just pushed from
// offset on, or a direct batch get; at the end it waits for the tail to
// be pushed a new message.
func (q *queue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: err}
	}
	if q.isClosed() {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ferry.ErrClosed}
	}
	if len(dst) == 0 {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: err}
	}
	if offset < 0 {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s at %d", q.id, offset), Err: ferry.ErrOffsetOutOfRange}
	}
	refreshed, lagged := false, 0
	for {
		q.mu.Lock()
		next, wake := q.next, q.wake
		q.mu.Unlock()
		switch {
		case offset < next:
			if n := q.fromTail(offset, dst); n > 0 {
				return n, nil
			}
			if n := q.fromBacklog(ctx, offset, dst); n > 0 {
				return n, nil
			}
			if n := q.fromAhead(ctx, offset, dst); n > 0 {
				return n, nil
			}
			n, err := q.get(ctx, offset, dst)
			if err == nil && n == min(len(dst), readBatch) && offset+int64(n) < next {
				// A backlog: a backlog reader is pushed it, or (when one
				// cannot run) the queue reads ahead.
				q.mu.Lock()
				if !q.startBacklogLocked(offset+int64(n)) && len(q.ahead) == 0 {
					q.startAheadLocked(offset + int64(n))
					q.topUpLocked()
				}
				q.mu.Unlock()
			}
			if err != nil || n > 0 {
				return n, err
			}
			// Nothing at or after offset though it was written: purged,
			// or (replicated) the direct get was answered by a follower
			// that has not applied it yet. The leader's first sequence
			// tells: not purged, ask again shortly.
			if q.boundedRefresh(ctx) == nil && lagged < maxLagRetries {
				q.mu.Lock()
				purged := offset < q.oldest
				q.mu.Unlock()
				if !purged {
					lagged++
					select {
					case <-time.After(lagRetryWait):
						continue
					case <-q.done:
						return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ferry.ErrClosed}
					case <-ctx.Done():
						return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ctx.Err()}
					}
				}
			}
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s at %d", q.id, offset), Err: ferry.ErrOffsetOutOfRange}
		case offset > next && !refreshed:
			refreshed = true
			if err := q.boundedRefresh(ctx); err != nil {
				return 0, q.readErr(ctx, err)
			}
			continue
		case offset > next:
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s at %d beyond %d", q.id, offset, next), Err: ferry.ErrOffsetOutOfRange}
		}
		// The tail wakes us (started now if it is not running); in case
		// it missed a message (its stream's leader died: it notices only
		// when heartbeats stop, and its recreation can fail while no
		// leader is elected) ask the leader every idleRefresh too.
		q.waited.Store(time.Now().UnixNano())
		if !q.backlogLive() { // a backlog reader is pushed what is written
			signal(q.tailWant)
		}
		poll := time.NewTimer(idleRefresh)
		select {
		case <-wake:
		case <-poll.C:
			_ = q.boundedRefresh(ctx) // an error: ask again next time
		case <-q.done:
			poll.Stop()
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ferry.ErrClosed}
		case <-ctx.Done():
			poll.Stop()
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ctx.Err()}
		}
		poll.Stop()
	}
}

// A Read waiting at the end of its queue asks the stream's leader for its
// last sequence every idleRefresh, in case the tail that wakes it missed
// a message.
const idleRefresh = time.Second

// A Read that finds nothing where the stream's leader says a message is
// (a direct get served by a follower behind the leader) asks again every
// lagRetryWait, up to maxLagRetries times.
const (
	lagRetryWait  = 2 * time.Millisecond
	maxLagRetries = 500
)

func (q *queue) readErr(ctx context.Context, err error) error {
	switch {
	case q.isClosed():
		return &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ferry.ErrClosed}
	case ctx.Err() != nil:
		return &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: ctx.Err()}
	}
	return &ferry.Error{Op: fmt.Sprintf("natsstore: read %s", q.id), Err: err}
}

// get reads up to len(dst) messages from offset on; 0 with no error when
// the stream holds nothing from there on.
func (q *queue) get(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	// A request whose server dies gets no reply: bound it, so that a
	// reader without a deadline gets an error and tries again.
	ctx, cancel := q.s.cfg.bound(ctx)
	defer cancel()
	want := min(len(dst), readBatch)
	// The direct get has a part of the bound: the rest is the leader's
	// (below), if no replica answers it.
	dctx, dcancel := context.WithTimeout(ctx, q.s.cfg.directTry())
	defer dcancel()
	it, err := jetstreamext.GetBatch(dctx, q.s.js, q.stream, want, jetstreamext.GetBatchSeq(uint64(offset)+1))
	if err != nil {
		return 0, q.readErr(ctx, err)
	}
	n := 0
	for raw, err := range it {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		if err != nil {
			if n > 0 {
				break // return what came; the next Read asks again
			}
			return 0, q.readErr(ctx, err)
		}
		off := int64(raw.Sequence) - 1
		if off != offset+int64(n) {
			if n == 0 {
				q.learn(off, off)
				return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s at %d (oldest %d)", q.id, offset, off), Err: ferry.ErrOffsetOutOfRange}
			}
			break
		}
		m, _, err := codec.Decode(raw.Data)
		if err != nil {
			return n, &ferry.Error{Op: fmt.Sprintf("natsstore: read %s at %d", q.id, off), Err: err}
		}
		m.Queue, m.Offset = q.id.Queue, off
		dst[n] = m
		n++
		if n == want {
			break
		}
	}
	if n == 0 {
		// A direct get may be served by a follower that lags, or by none
		// (its iteration ends at dctx's end without an error): ask the
		// leader before calling the offset gone.
		m, ok, err := q.leaderGet(ctx, uint64(offset)+1)
		if err != nil {
			return 0, q.readErr(ctx, err)
		}
		if ok {
			dst[0] = m
			return 1, nil
		}
	}
	return n, nil
}

// Release implements [ferry.Releaser]: a goroutine of the queue purges the
// stream below offset and tells blocked writers (in every process, on
// "<prefix>.rel.<stream>"). A queue without [ferry.Block] ignores it.
func (q *queue) Release(offset int64) {
	if q.purgeReq == nil {
		return
	}
	q.mu.Lock()
	if offset <= q.released {
		q.mu.Unlock()
		return
	}
	q.released = offset
	q.mu.Unlock()
	signal(q.purgeReq)
}

func (q *queue) purger() {
	for {
		select {
		case <-q.done:
			return
		case <-q.purgeReq:
		}
		q.mu.Lock()
		upTo := q.released
		q.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), q.s.cfg.opTimeout)
		err := q.handle.Purge(ctx, jetstream.WithPurgeSequence(uint64(upTo)+1))
		cancel()
		if err == nil {
			q.learn(upTo, upTo)
			_ = q.s.js.Conn().Publish(q.relSubj, nil)
		}
	}
}

// Close implements [ferry.Queue]: blocked reads and writes return
// [ferry.ErrClosed]; it waits for the queue's goroutines. Idempotent.
func (q *queue) Close() error {
	q.once.Do(func() {
		close(q.done)
		q.cancel()
		if q.relSub != nil {
			_ = q.relSub.Unsubscribe()
		}
		q.wg.Wait()
		q.mu.Lock()
		q.noAhead = true
		q.ahead = nil
		q.stopBacklogLocked()
		q.mu.Unlock()
		q.aheadWG.Wait()
		q.amu.Lock()
		q.aclosed = true
		q.amu.Unlock()
		q.awg.Wait() // the acker reports what is in flight: ErrClosed
		q.s.mu.Lock()
		delete(q.s.queues, q)
		q.s.mu.Unlock()
	})
	return nil
}

func timeDuration(ns int64) time.Duration { return time.Duration(ns) }
