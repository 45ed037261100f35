package ferry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxInFlight is the default bound on a producer's outstanding
// asynchronous sends (see [Producer.SendAsync]): PublishAsync's default
// window in nats.go.
const DefaultMaxInFlight = 4000

// WithMaxInFlight bounds the sends of [Producer.SendAsync] that have not
// been reported yet; at the bound SendAsync waits for room. A value below
// 1 is [ErrInvalidOption]. Default: [DefaultMaxInFlight].
func WithMaxInFlight(n int) ProducerOption { return func(c *producerConfig) { c.inFlight = n } }

// Asynchronous writes are at most this many messages and about this many
// bytes each (at least one message): natsstore's batch bound, and a
// frame of a few MiB.
const (
	asyncBatch      = 1000
	asyncBatchBytes = 4 << 20
)

// asyncSend is one SendAsync: what its pipe writes and whom it tells.
type asyncSend struct {
	ctx    context.Context
	em     *EnhancedMessage
	size   int
	at     time.Time // DeliverAt, for the delay pipe
	target QueueID   // where consumers get it
	res    SendResult
	err    error
	done   func(SendResult, error)
}

// pipe writes one queue's asynchronous sends in the order they were
// made, each write taking every send waiting then (up to a batch), so a
// goroutine's sends share writes (and a file store's fdatasyncs). Its
// goroutine runs while sends wait and exits when none do; the producer's
// wg counts it. The delay pipe (q nil) places delayed messages.
type pipe struct {
	p *Producer
	q Queue
	// aw is q as an AsyncWriter (nil for the others and for Block
	// topics): up to asyncWrites of its writes are in flight, their
	// reports kept in order by reports.
	aw      AsyncWriter
	writes  chan struct{} // a token per write in flight (aw only)
	rmu     sync.Mutex    // guards reports and draining
	reports []*report     // writes begun, oldest first, not yet reported
	// draining says a goroutine is running the reports at the head.
	draining bool
	// mu guards pending and the writes of running; it is never held
	// while a store writes or a callback runs.
	mu      sync.Mutex
	pending []*asyncSend
	spare   []*asyncSend // a drained pending slice, for reuse
	// running says a goroutine drains pending; it is false only while
	// pending is empty and nothing is being written, so a send that sees
	// it false (after every send made before it) may write at once.
	running atomic.Bool
}

// SendAsync sends m as [Producer.Send] does, without waiting for the
// write: it stamps, checks and routes m at once, and a bad message (see
// Send) is an error returned here, with nothing sent and done never
// called. Otherwise SendAsync returns nil and done (if not nil) is
// called exactly once with what Send would have returned: where m landed,
// or why it was not written (ErrClosed if the broker closed meanwhile;
// for a write cut off by its ctx, the outcome may be unknown on a network
// store, as for Send).
//
// Sends to one queue (for delayed messages, to the delay queues) are
// written in the order SendAsync was called and reported in that order;
// sends to different queues are written in parallel. A send and an
// asynchronous send of one producer are not ordered with each other.
//
// At most the producer's bound ([WithMaxInFlight]) of sends are
// outstanding; at the bound SendAsync waits for room until ctx is done
// (its error, nothing sent) or the producer closes ([ErrClosed]). ctx
// also bounds the wait before the write: a send whose ctx is done when
// its write starts is reported with ctx's error and not written, and a
// write waiting for room on a [Block] topic ends when the ctx of every
// send in it is done.
//
// A queue's waiting sends go as one write (up to 1000 messages), so one
// goroutine's sends share a file store's fdatasyncs; a queue that is an
// [AsyncWriter] (natsstore's) has up to 4 such writes in flight, else one.
//
// done runs on a goroutine of the producer's, one per queue with sends
// outstanding (for an AsyncWriter, on the queue's goroutine that reports
// its writes), callbacks of one queue one after another; for a memory
// queue with nothing outstanding the write is immediate and done runs on
// the caller's goroutine before SendAsync returns. No lock of the
// producer's is held while done runs, and the send's slot in the bound
// is free by then: done may call Send, and SendAsync while the bound has
// room (a SendAsync in done that waits for room may wait for ever, as the
// reports that would make room can be queued behind done: give it a ctx
// that ends). done must not call [Producer.Flush] or [Producer.Close]
// (they wait for done to return), and should be quick, as it holds up
// the queue's later reports. The caller must not modify m afterwards.
func (p *Producer) SendAsync(ctx context.Context, m *Message, done func(SendResult, error)) error {
	if err := checkContext(ctx); err != nil {
		p.failed.Add(1)
		return &Error{Op: "send async", Err: err}
	}
	if err := p.sendAsync(ctx, m, done); err != nil {
		p.failed.Add(1)
		return &Error{Op: "send async", Err: err}
	}
	return nil
}

func (p *Producer) sendAsync(ctx context.Context, m *Message, done func(SendResult, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	em, c := p.envelope()
	now := p.b.clock.now()
	t, i, err := p.prepare(ctx, m, em, now, c) // bad input is reported at once, even at the bound
	if err != nil {
		return err
	}
	delayed := p.delayed(m)
	var pp *pipe
	if delayed {
		pp = p.pipeFor(nil, nil)
	} else {
		pp = p.pipeFor(t, t.queues[i])
		if pp.now(ctx, em, now, done) {
			return nil
		}
	}
	if err := p.acquire(ctx); err != nil {
		if p.hooks != nil {
			p.hooks.onSent(ctx, em, err)
		}
		return err
	}
	p.outstanding.Add(1)
	if p.closed.Load() { // Close is waiting for outstanding sends: this is not one
		p.finish(1)
		if p.hooks != nil {
			p.hooks.onSent(ctx, em, ErrClosed)
		}
		return ErrClosed
	}
	s := &asyncSend{ctx: ctx, em: em, size: m.Size(), done: done}
	if delayed {
		s.at, s.target = m.DeliverAt, QueueID{Topic: t.meta.Name, Queue: i}
		s.res.Offset = -1
	}
	pp.add(s)
	return nil
}

// acquire takes a slot in the in-flight bound, waiting for one until ctx
// is done or the producer closes.
func (p *Producer) acquire(ctx context.Context) error {
	select {
	case p.slots <- struct{}{}:
		return nil
	default:
	}
	select {
	case p.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closing:
		return ErrClosed
	}
}

// finish counts n sends reported: their slots are free (released
// before), and Flush and Close wake when none is outstanding.
func (p *Producer) finish(n int) {
	for range n {
		<-p.slots
	}
	p.settle(n)
}

// settle counts n sends whose callbacks have returned.
func (p *Producer) settle(n int) {
	if p.outstanding.Add(-int64(n)) != 0 || p.waiters.Load() == 0 {
		return
	}
	p.amu.Lock()
	if p.idle != nil && p.outstanding.Load() == 0 {
		close(p.idle)
		p.idle = nil
	}
	p.amu.Unlock()
}

// Flush waits until every asynchronous send is reported (its callback
// returned), or ctx is done (its error; the sends go on). Sends made
// meanwhile are waited for too. It must not be called from a
// SendAsync callback.
func (p *Producer) Flush(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "flush", Err: err}
	}
	if err := p.waitIdle(ctx); err != nil {
		return &Error{Op: "flush", Err: err}
	}
	return nil
}

func (p *Producer) waitIdle(ctx context.Context) error {
	// waiters is raised before outstanding is read, and settle lowers
	// outstanding before it reads waiters: one of the two sees the other.
	p.waiters.Add(1)
	defer p.waiters.Add(-1)
	for {
		p.amu.Lock()
		if p.outstanding.Load() == 0 {
			p.amu.Unlock()
			return nil
		}
		if p.idle == nil {
			p.idle = make(chan struct{})
		}
		ch := p.idle
		p.amu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// asyncWrites bounds the writes in flight of one queue that is an
// [AsyncWriter].
const asyncWrites = 4

// report is one write of a pipe with an AsyncWriter: its sends, reported
// once it is done and every write begun before it has been reported.
type report struct {
	batch []*asyncSend
	ready bool
}

// pipeFor returns the pipe of queue q of t (nil: the delay pipe), making
// it on first use.
func (p *Producer) pipeFor(t *topicState, q Queue) *pipe {
	if pp := p.lastPipe.Load(); pp != nil && pp.q == q {
		return pp
	}
	p.amu.Lock()
	pp := p.pipes[q]
	if pp == nil {
		if p.pipes == nil {
			p.pipes = make(map[Queue]*pipe)
		}
		pp = &pipe{p: p, q: q}
		if aw, ok := q.(AsyncWriter); ok && t != nil && t.meta.Retention.Overflow != Block {
			pp.aw, pp.writes = aw, make(chan struct{}, asyncWrites)
		}
		p.pipes[q] = pp
	}
	p.amu.Unlock()
	p.lastPipe.Store(pp)
	return pp
}

// now writes em at once if the pipe is a memory queue's with nothing
// waiting and the queue has room, reporting it on the caller's goroutine
// (as a Send, it takes no slot in the bound); it reports whether it did.
func (pp *pipe) now(ctx context.Context, em *EnhancedMessage, now time.Time, done func(SendResult, error)) bool {
	mq, ok := pp.q.(*MemoryQueue)
	if !ok || pp.running.Load() {
		return false
	}
	one := [1]*EnhancedMessage{em}
	first, err := mq.write(ctx, one[:], false, now)
	if errors.Is(err, ErrQueueFull) {
		return false // the pipe waits for room
	}
	p := pp.p
	if p.hooks != nil {
		p.hooks.onSent(ctx, em, err)
	}
	if err != nil {
		p.failed.Add(1)
		if done != nil {
			done(SendResult{}, &Error{Op: "send async", Err: err})
		}
		return true
	}
	p.sent.Add(1)
	if done != nil {
		done(sentResult(em, first), nil)
	}
	return true
}

// add queues s for the pipe's goroutine, starting it if need be.
func (pp *pipe) add(s *asyncSend) {
	pp.mu.Lock()
	pp.pending = append(pp.pending, s)
	if !pp.running.Load() {
		pp.running.Store(true)
		pp.p.wg.Add(1) // the sender holds an outstanding send: Close has not reached wg.Wait
		go pp.run()
	}
	pp.mu.Unlock()
}

// run writes the pipe's sends until none waits.
func (pp *pipe) run() {
	defer pp.p.wg.Done()
	for {
		pp.mu.Lock()
		if len(pp.pending) == 0 {
			pp.running.Store(false)
			pp.mu.Unlock()
			return
		}
		n, bytes := 0, 0
		for n < len(pp.pending) && n < asyncBatch && (n == 0 || bytes+pp.pending[n].size <= asyncBatchBytes) {
			bytes += pp.pending[n].size
			n++
		}
		var batch []*asyncSend
		whole := n == len(pp.pending)
		if pp.aw != nil { // the batch lives on until its write is reported
			batch, pp.pending = pp.pending[:n:n], pp.pending[n:]
			if whole {
				pp.pending = nil
			}
			pp.mu.Unlock()
			pp.begin(batch)
			continue
		}
		if whole {
			batch, pp.pending, pp.spare = pp.pending, pp.spare[:0], nil
		} else {
			batch, pp.pending = pp.pending[:n:n], pp.pending[n:]
		}
		pp.mu.Unlock()
		pp.write(batch)
		if whole {
			clear(batch)
			pp.mu.Lock()
			pp.spare = batch[:0]
			pp.mu.Unlock()
		}
	}
}

// write writes batch, in order: a send whose ctx is done is reported
// with its error and left out; the rest are one write (one placement for
// the delay pipe), and all report its outcome. A batch too large for the
// queue as one write is written message by message.
func (pp *pipe) write(batch []*asyncSend) {
	var live []*asyncSend
	for _, s := range batch {
		if s.err = s.ctx.Err(); s.err == nil {
			live = append(live, s)
		}
	}
	if len(live) > 0 {
		err := pp.store(live)
		switch {
		case err == nil:
		case pp.q == nil: // placed level by level: those placed have results
			for _, s := range live {
				if s.res.Offset < 0 {
					s.err = err
				}
			}
		case errors.Is(err, ErrMessageTooLarge) && len(live) > 1:
			for _, s := range live {
				s.err = pp.store([]*asyncSend{s})
			}
		default:
			for _, s := range live {
				s.err = err
			}
		}
	}
	pp.reportEach(batch)
}

// begin starts the write of batch on the pipe's AsyncWriter, once fewer
// than asyncWrites are in flight; sends whose ctx is done are left out
// (reported with their error, in order with the others).
func (pp *pipe) begin(batch []*asyncSend) {
	var live []*asyncSend
	for _, s := range batch {
		if s.err = s.ctx.Err(); s.err == nil {
			live = append(live, s)
		}
	}
	r := &report{batch: batch}
	pp.rmu.Lock()
	pp.reports = append(pp.reports, r)
	pp.rmu.Unlock()
	if len(live) == 0 {
		pp.complete(r)
		return
	}
	pp.writes <- struct{}{}
	ems := make([]*EnhancedMessage, len(live))
	for i, s := range live {
		ems[i] = s.em
	}
	ctx, stop := batchContext(live)
	pp.aw.WriteAsync(ctx, ems, func(first int64, err error) {
		stop()
		<-pp.writes
		for _, s := range live {
			if s.err = err; err == nil {
				id := QueueID{Topic: s.em.Topic, Queue: s.em.Queue}
				s.res = SendResult{ID: s.em.ID, Queue: id, Offset: s.em.Offset, Target: id}
			}
		}
		if err == nil {
			markDuplicates(first, ems, func(i int) *SendResult { return &live[i].res })
		}
		pp.complete(r)
	})
}

// complete marks r done and, unless another goroutine is at it, reports
// every done write at the head of the pipe's reports, in order.
func (pp *pipe) complete(r *report) {
	pp.rmu.Lock()
	r.ready = true
	if pp.draining {
		pp.rmu.Unlock()
		return
	}
	pp.draining = true
	for len(pp.reports) > 0 && pp.reports[0].ready {
		head := pp.reports[0]
		pp.reports[0] = nil
		pp.reports = pp.reports[1:]
		pp.rmu.Unlock()
		pp.reportEach(head.batch)
		pp.rmu.Lock()
	}
	pp.draining = false
	pp.rmu.Unlock()
}

// store writes ss as one write (the delay pipe: one placement) under a
// context that ends when every send's ctx has, filling in their results.
func (pp *pipe) store(ss []*asyncSend) error {
	ctx, stop := batchContext(ss)
	defer stop()
	p := pp.p
	if pp.q == nil {
		ds := make([]delayed, len(ss))
		for i, s := range ss {
			ds[i] = delayed{em: s.em, target: s.target, at: s.at, res: &s.res}
		}
		return p.b.delay.placeBatch(ctx, ds)
	}
	ems := make([]*EnhancedMessage, len(ss))
	for i, s := range ss {
		ems[i] = s.em
	}
	var first int64
	var err error
	if mq, ok := pp.q.(*MemoryQueue); ok {
		first, err = mq.write(ctx, ems, true, p.b.clock.now())
	} else {
		first, err = pp.q.Write(ctx, ems)
	}
	if err != nil {
		p.recheck(ctx, ss[0].em.Topic, err) // the next send finds a topic created again
		return err
	}
	for _, s := range ss {
		id := QueueID{Topic: s.em.Topic, Queue: s.em.Queue}
		s.res = SendResult{ID: s.em.ID, Queue: id, Offset: s.em.Offset, Target: id}
	}
	markDuplicates(first, ems, func(i int) *SendResult { return &ss[i].res })
	return nil
}

// batchContext returns the context a write of ss runs under: their ctx
// when they share one, else one that ends when all of theirs have
// (never, if one of them never ends).
func batchContext(ss []*asyncSend) (context.Context, func()) {
	first := ss[0].ctx
	same := true
	for _, s := range ss[1:] {
		if s.ctx != first {
			same = false
			if s.ctx.Done() == nil {
				return context.Background(), func() {}
			}
		}
	}
	if same {
		return first, func() {}
	}
	if first.Done() == nil {
		return context.Background(), func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(ss)))
	stops := make([]func() bool, len(ss))
	for i, s := range ss {
		stops[i] = context.AfterFunc(s.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, st := range stops {
			st()
		}
		cancel()
	}
}

// reportEach frees the slots of ss, counts them, runs the hooks, then
// the callbacks in order, and last lets Flush and Close see them done.
func (pp *pipe) reportEach(ss []*asyncSend) {
	p := pp.p
	var failed uint64
	for _, s := range ss {
		<-p.slots
		if s.err != nil {
			failed++
		}
		if p.hooks != nil {
			p.hooks.onSent(s.ctx, s.em, s.err)
		}
	}
	p.failed.Add(failed)
	p.sent.Add(uint64(len(ss)) - failed)
	for _, s := range ss {
		if s.done == nil {
			continue
		}
		if s.err != nil {
			s.done(SendResult{}, &Error{Op: "send async", Err: s.err})
		} else {
			s.done(s.res, nil)
		}
	}
	p.settle(len(ss))
}

// closeAsync stops intake of asynchronous sends and waits until every
// outstanding one is reported and the pipes' goroutines have exited.
func (p *Producer) closeAsync() {
	p.closeOnce.Do(func() { close(p.closing) })
	_ = p.waitIdle(context.Background())
	p.wg.Wait()
}
