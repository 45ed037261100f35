package ferry

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Transactional handlers: consume, transform, produce, exactly once.
//
// A [Transactional] consumer's handler sends through the [Outbox] of its
// context. What it sends is kept until the handler returns; on nil the
// messages, and the finishing of the offset handled, become one record
// of the group's transaction log: a system topic,
// "%TXN%<escaped group>%%<topic>" (see [TransactionLog]), with as many
// queues as the topic, queue q of the log for queue q of the topic. The
// record's write is the commit: one message in one queue, so it is
// stored whole or not at all on every storage. Concurrent handlers of a
// queue share one log write (on filestore, one fdatasync: group
// commit). The outputs are then written to their topics, those of one
// log write together (one write per target queue), each with a
// deduplication key derived from the record's position (the message's
// own [Message.DedupKey] when it has one), so that writing them again
// stores nothing twice; the offset then finishes as any handled one. In
// memory, where the log and the outputs' queues are memory queues (and
// no output is delayed), the record and the outputs are one write, made
// with every queue involved locked: a consumer sees all of them or none,
// a next owner has nothing to write again, and the outputs carry no
// derived keys (a key the sender gave is checked as ever). There, in
// concurrent mode, the calls of the batch a handler goroutine takes
// (the messages it handles one after another before their offsets
// finish together) commit together at its end, just before their
// offsets finish: one record for their inputs, and all their outputs,
// in one such write. Their outputs become visible then, not as each
// call returns; calls are held about a millisecond at most (a slower
// call commits as it returns).
//
// The next owner of a queue (after a rebalance, a lease lost, a crash)
// first writes a take marker with its lease token to the queue's log,
// then reads the log from its applied floor (a cursor of the group on
// the log) to the marker: each input offset at or above the queue's
// cursor that has a record there finishes with its last record's
// outputs, written again (a no-op when they were written: the keys), and
// is not handled again. A record written after a marker with a lower
// token than the marker's (an owner that lost its lease and went on) is
// void, and that owner, which checks its writes against the log, writes
// none of its outputs. So after any crash each finished input's outputs
// are stored once, and none of an attempt that did not finish.
//
// The limit is the targets' [TopicMeta.DedupWindow]: outputs written
// again more than the window after they first were (a queue left
// untaken that long after a crash) can be stored twice. Outputs are
// visible in their topics when written, each topic on its own, shortly
// after the commit (as in Kafka, where each partition's commit marker
// lands on its own).

// Transactional makes each handler call a transaction (push consumers
// only): the messages the handler sends through [OutboxFrom] of its
// context are stored if and only if the call succeeds, together with
// the finishing of the message handled, exactly once even across
// crashes, restarts and hand-overs (see the package doc and
// [TransactionLog]). A call that fails, panics, times out or loses its
// queue sends nothing, and the message is retried or dead-lettered as
// usual; a dead-lettered message's outputs are never stored. It works in
// every mode (concurrent, [Ordered], [OrderedByKey]) and with retries
// off the queue, not with [Broadcast], a [Batch] handler or a
// [TxCursorStore] (each [ErrInvalidOption]). Outputs go to topics that
// deduplicate (not [DedupOff]) of the consumer's broker.
func Transactional() ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.transactional = true })
}

// TransactionLog returns the name of the system topic where group's
// transactional handling of topic's messages keeps its records (see
// [Transactional]): "%TXN%", the group escaped as [RetryTopic] escapes
// it, "%%", the topic. A pair whose name would be longer than
// [MaxTopicNameLen] is [ErrInvalidOption].
func TransactionLog(group, topic string) (string, error) {
	if err := ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return "", err
	}
	name := txnPrefix + escapeName(group) + "%%" + topic
	if len(name) > MaxTopicNameLen {
		return "", fmt.Errorf("%w: group %q and topic %q make a transaction log name of %d bytes, over %d", ErrInvalidOption, group, topic, len(name), MaxTopicNameLen)
	}
	return name, nil
}

const txnPrefix = "%TXN%"

// Outbox holds the messages a [Transactional] handler call sends: they
// are stored when the call returns nil, never otherwise. It is safe for
// concurrent use during the call; once the call returned its Sends are
// [ErrOutboxDone].
type Outbox struct {
	ctx   context.Context
	d     *deliverer
	mu    sync.Mutex
	outs  []txnOutput
	one   [1]txnOutput // outs of a call that sends one message
	bytes int
	done  bool
}

// txnOutput is one message of an outbox: em, for queue q of topic t,
// due at (zero: now), sent through a producer with hooks.
type txnOutput struct {
	t     *topicState
	q     int
	em    *EnhancedMessage
	at    time.Time
	hooks *hookSet
}

type outboxKey struct{}

// outboxCtx is a transactional handler call's context.
type outboxCtx struct {
	context.Context
	ob *Outbox
}

func (c *outboxCtx) Value(key any) any {
	if key == (outboxKey{}) {
		return c.ob
	}
	return c.Context.Value(key)
}

// OutboxFrom returns the outbox of a [Transactional] consumer's handler
// call from its context (or one derived from it); nil for any other
// context. Its methods on nil return [ErrInvalidOption].
func OutboxFrom(ctx context.Context) *Outbox {
	if ctx == nil {
		return nil
	}
	o, _ := ctx.Value(outboxKey{}).(*Outbox)
	return o
}

// Send adds m to the outbox, routed as the broker's default producer
// routes (see [KeyHashRouter]). It checks m as [Producer.Send] does (bad
// input, an unknown or system topic, a size over the limit: the same
// errors) and writes nothing until the call succeeds. A topic that does
// not deduplicate ([DedupOff]) is [ErrInvalidOption]: an output written
// again after a crash must be recognised. The outputs of one call count
// together at most [DefaultMaxMessageBytes] (their [Message.Size]s), over
// which Send is [ErrMessageTooLarge]. After the call returned it is
// [ErrOutboxDone]. The caller must not modify m afterwards.
//
// The producer's hooks (the broker's, for Send) see each output as they
// see a producer's send: [HookSend] in Send, then [HookSent] once, with
// the call's context: with no error once the output is written (its
// Queue, Offset and StoreUnixNano set), before the input's offset
// finishes; with an error when Send refuses it, when the call fails, and
// when the queue is given up before the outputs were written (its next
// owner then writes them if the call's record was stored, and no hook
// sees that write).
func (o *Outbox) Send(m *Message) error { return o.send(nil, m) }

// SendVia is Send routed by p, a producer of the consumer's broker (its
// router, its size limit, its hooks); a producer of another broker is
// [ErrInvalidOption].
func (o *Outbox) SendVia(p *Producer, m *Message) error {
	if p == nil {
		return &Error{Op: "outbox send", Err: fmt.Errorf("%w: nil producer", ErrInvalidOption)}
	}
	return o.send(p, m)
}

// Len returns how many messages the outbox holds.
func (o *Outbox) Len() int {
	if o == nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.outs)
}

func (o *Outbox) send(p *Producer, m *Message) error {
	if o == nil {
		return &Error{Op: "outbox send", Err: fmt.Errorf("%w: not the context of a Transactional consumer's handler call", ErrInvalidOption)}
	}
	if err := o.add(p, m); err != nil {
		return &Error{Op: "outbox send", Err: err}
	}
	return nil
}

func (o *Outbox) add(p *Producer, m *Message) error {
	o.mu.Lock()
	done := o.done
	o.mu.Unlock()
	if done {
		return ErrOutboxDone
	}
	b := o.d.m.b
	if p == nil {
		var err error
		if p, err = o.d.outboxProducer(); err != nil {
			return err
		}
	} else if p.b != b {
		return fmt.Errorf("%w: a producer of another broker", ErrInvalidOption)
	}
	em, c := p.envelope()
	t, i, err := p.prepare(o.ctx, m, em, b.clock.now(), c)
	if err != nil {
		return err
	}
	// The hooks' OnSend saw em: OnSent follows, here when it is refused,
	// else when the call ends (see sent).
	out := txnOutput{t: t, q: i, em: em, hooks: p.hooks}
	if err := o.keep(out, m); err != nil {
		p.hooks.onSent(o.ctx, em, err)
		return err
	}
	return nil
}

// keep adds out, the output made of m, to the outbox.
func (o *Outbox) keep(out txnOutput, m *Message) error {
	if dq, ok := out.t.queues[out.q].(Deduplicator); !ok || dq.DedupWindow() <= 0 {
		return fmt.Errorf("%w: topic %q does not deduplicate (see TopicMeta.DedupWindow): a transaction's outputs need it", ErrInvalidOption, out.t.meta.Name)
	}
	if out.at = m.DeliverAt; !out.at.IsZero() && !out.at.After(o.d.m.b.time.Now()) {
		out.at = time.Time{}
	}
	n := m.Size()
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.done:
		return ErrOutboxDone
	case o.bytes+n > DefaultMaxMessageBytes:
		return fmt.Errorf("%w: the outbox's messages would take %d bytes, over %d", ErrMessageTooLarge, o.bytes+n, DefaultMaxMessageBytes)
	}
	if o.outs == nil {
		o.outs = o.one[:0]
	}
	o.outs = append(o.outs, out)
	o.bytes += n
	return nil
}

// sent calls the hooks' OnSent for each of outs with ctx, the call's
// context: err nil when they were written (each em then has its Queue,
// Offset and StoreUnixNano, those of its first copy for one written
// before), else why they were not, or may not have been.
func sent(ctx context.Context, outs []txnOutput, err error) {
	for i := range outs {
		outs[i].hooks.onSent(ctx, outs[i].em, err)
	}
}

// close ends the outbox's call: later Sends are ErrOutboxDone. It
// returns what was sent.
func (o *Outbox) close() []txnOutput {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = true
	return o.outs
}

// outboxProducer returns the producer the outboxes of d's handler calls
// route with by default, made at first use.
func (d *deliverer) outboxProducer() (*Producer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.outbox != nil {
		return d.outbox, nil
	}
	p, err := d.m.b.NewProducer(WithProducerName("ferry-outbox-" + d.m.group))
	if err != nil {
		return nil, err
	}
	d.outbox = p
	return p, nil
}

// outboxCall is what a Transactional handler call gets: its outbox, and
// the context that carries it.
type outboxCall struct {
	ob  Outbox
	ctx outboxCtx
}

// callSlab is a block of outbox calls that a deliverer's calls take one
// by one, as a producer's Sends take envelopes (see envSlab): one
// allocation for callSlabLen calls. An outbox or context a handler keeps
// keeps its block.
type callSlab struct {
	next  atomic.Int32
	calls [callSlabLen]outboxCall
}

const callSlabLen = 32

// outboxCall returns a zeroed outbox call from d's block, which it
// replaces when used up.
func (d *deliverer) outboxCall() *outboxCall {
	for {
		s := d.calls.Load()
		if s != nil {
			if i := s.next.Add(1) - 1; i < callSlabLen {
				return &s.calls[i]
			}
		}
		d.calls.CompareAndSwap(s, &callSlab{}) // a racing call may have put one: use it
	}
}

// callOutbox is call for a Transactional consumer: the handler gets an
// outbox in its context, and what it sent commits with msg's offset
// when it succeeds (see txnLog.commit).
func (d *deliverer) callOutbox(dctx *deliveryCtx, hc *handlerCtx, r *queueRun, msg, view *EnhancedMessage) error {
	call := d.outboxCall()
	ob, ctx := &call.ob, &call.ctx
	ob.d = d
	ctx.Context, ctx.ob = hc, ob
	ob.ctx = ctx
	var err error
	if hs := d.m.hooks; hs != nil && (len(hs.handle) > 0 || len(hs.handled) > 0) {
		// As callHooked, the outbox taking the handler's context: the
		// hooks see the outputs' sends in the call's (its span, say).
		var hctx context.Context = ctx
		for _, h := range hs.handle {
			if c := h.OnHandle(hctx, view); c != nil {
				hctx = c
			}
		}
		ob.ctx = hctx
		start := time.Now()
		err = d.safeHandle(dctx, hctx, view)
		took := time.Since(start)
		for _, h := range hs.handled {
			h.OnHandled(hctx, view, took, err)
		}
	} else {
		err = d.safeHandle(dctx, ctx, view)
	}
	outs := ob.close()
	octx := ob.ctx
	if err != nil {
		sent(octx, outs, &Error{Op: "outbox send", Err: fmt.Errorf("not stored: the handler call failed: %w", err)})
	}
	if err != nil || len(outs) == 0 {
		return err
	}
	if st := dctx.stage; st != nil && st.add(d, dctx, r, stagedCall{msg: msg, attempt: hc.d.Attempt, outs: outs, ctx: octx}) {
		return nil // committed at the end of the batch (see txnStage)
	}
	if err := r.tl.commit(octx, r, msg.Offset, outs); err != nil {
		dctx.handled--
		dctx.failed++
		return err
	}
	return nil
}

// The records of a transaction log. A record's Tag says what it is:
// "%txn,<input offset>,<token>" for a committed call, "%txn-take,
// <token>" for a take marker; a record's body holds its outputs.
const (
	txnRecordTag = "%txn,"
	txnMarkerTag = "%txn-take,"
)

// parseTxnTag reads a log message's tag: marker reports a take marker
// (off is then -1).
func parseTxnTag(tag string) (marker bool, off int64, token uint64, err error) {
	bad := func() (bool, int64, uint64, error) {
		return false, 0, 0, fmt.Errorf("%w: transaction log record tagged %q", ErrCorrupt, tag)
	}
	switch {
	case len(tag) > len(txnMarkerTag) && tag[:len(txnMarkerTag)] == txnMarkerTag:
		token, err := strconv.ParseUint(tag[len(txnMarkerTag):], 10, 64)
		if err != nil {
			return bad()
		}
		return true, -1, token, nil
	case len(tag) > len(txnRecordTag) && tag[:len(txnRecordTag)] == txnRecordTag:
		rest := tag[len(txnRecordTag):]
		for i := 0; i < len(rest); i++ {
			if rest[i] != ',' {
				continue
			}
			off, err1 := strconv.ParseInt(rest[:i], 10, 64)
			token, err2 := strconv.ParseUint(rest[i+1:], 10, 64)
			if err1 != nil || err2 != nil || off < 0 {
				return bad()
			}
			return false, off, token, nil
		}
	}
	return bad()
}
