package ferry

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// Retrying and dead-lettering, in one place. A failed attempt (a
// handler's error or panic) is retried, with backoff ([WithRetry],
// [RetryAfter]), until the last attempt or a [Permanent] error, after
// which the message goes to the dead-letter topic. A retry in place
// keeps the message in flight: [Ordered] waits its backoff out in the
// handling worker (deliverer.handleOrdered), others wait in the retry
// loop below (retryLoop), as does a failed retry or dead-letter write.
//
// Retries off the queue. In concurrent mode (not [Ordered], not
// [Broadcast]) a failed message with attempts left is written to the
// group's retry topic, due after its backoff (a delayed message, see
// [Message.DeliverAt]), with its attempt count and origin in headers, and
// its offset finishes at once: its queue flows on, and a rebalance
// redelivers only what is in flight. The consumer reads the retry topic
// too, with a second member of the group (started with the first retry,
// or at Start when the topic exists): the handler gets the message as it
// was (its Topic, Queue and Offset are the origin's), with the true
// attempt number in its [Delivery], across owners and restarts.

// RetryAfter marks err so that the consumer tries its message again after
// d, instead of after the [WithRetry] backoff (the attempt still counts).
// RetryAfter(nil, d) is nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, d: max(d, 0)}
}

type retryAfterError struct {
	err error
	d   time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// retryWait returns the wait before the next attempt after attempt
// failed with err.
func (d *deliverer) retryWait(err error, attempt int) time.Duration {
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return ra.d
	}
	return backoff(d.m.cfg.backoff, d.m.cfg.maxBackoff, attempt)
}

// offQueue reports whether failures are retried off the queue.
func (m *groupMember) offQueue() bool {
	return !m.cfg.ordered && !m.cfg.orderedByKey && !m.cfg.broadcast && !m.pull && m.cfg.maxAttempts > 1
}

// firstAttempt returns the attempt a fetched message makes: 1, or for a
// message of a retry topic one more than its header says were made.
func (d *deliverer) firstAttempt(msg *EnhancedMessage) int {
	if d.m.cfg.retryOf == "" {
		return 1
	}
	n, err := strconv.Atoi(msg.Headers[HeaderAttempts])
	if err != nil || n < 1 {
		return 1
	}
	return n + 1
}

// view returns msg as the handler sees it: for a message of a retry
// topic, a copy with its origin's Topic, Queue, Offset and ID.
func (d *deliverer) view(msg *EnhancedMessage) *EnhancedMessage {
	if d.m.cfg.retryOf == "" {
		return msg
	}
	v := *msg
	v.Topic = d.m.cfg.retryOf
	var id MessageID
	if id.UnmarshalText([]byte(msg.Headers[HeaderOriginID])) == nil {
		v.ID = id
	}
	if q, err := strconv.Atoi(msg.Headers[HeaderOriginQueue]); err == nil {
		v.Queue = q
	}
	if o, err := strconv.ParseInt(msg.Headers[HeaderOriginOffset], 10, 64); err == nil {
		v.Offset = o
	}
	return &v
}

// retryOff writes msg, whose attempt failed with cause, to the retry topic
// due after its wait, and reports whether it went (then msg finishes). If
// it did not, msg stays unfinished and another try is scheduled.
//
// Each attempt's write has an ID of its own (id, zero on the first try:
// made then), kept for the tries of that write: a store that drops
// writes whose ID it has seen (natsstore, for a retried publish) would
// otherwise drop the second retry of a message as a duplicate of the
// first. The handler sees the original ID ([HeaderOriginID]).
func (d *deliverer) retryOff(r *queueRun, msg *EnhancedMessage, attempt int, cause error, try int, id MessageID) bool {
	m := d.m
	if !r.h.lands() {
		r.buf.abandon(msg) // the lease is gone: the next owner attempts it again
		return false
	}
	if id == (MessageID{}) {
		id = messageID(time.Now(), reserveIDs(1))
	}
	target := m.cfg.retryTopic
	err := d.ensureRetry(r.hctx)
	var t *topicState
	if err == nil {
		t, err = m.b.topic(target)
	}
	if err == nil {
		v := d.view(msg)
		h := make(map[string]string, len(msg.Headers)+7)
		maps.Copy(h, msg.Headers)
		if m.cfg.retryOf == "" { // the first retry: the origin is this message (whatever headers it came with)
			h[HeaderOriginTopic] = v.Topic
			h[HeaderOriginQueue] = strconv.Itoa(v.Queue)
			h[HeaderOriginOffset] = strconv.FormatInt(v.Offset, 10)
			h[HeaderOriginID] = v.ID.String()
		}
		h[HeaderGroup] = m.group
		h[HeaderAttempts] = strconv.Itoa(attempt)
		h[HeaderError] = clip(cause.Error(), maxErrorHeader)
		em := &EnhancedMessage{
			// The key makes the retry write idempotent: a retry of this
			// attempt written again (after a crash, before the origin's
			// cursor moved) is not stored twice.
			Message: Message{Topic: target, Key: msg.Key, Tag: msg.Tag, Headers: h, Body: msg.Body,
				DedupKey: "%retry:" + m.group + ":" + v.QueueID().String() + ":" + strconv.FormatInt(v.Offset, 10) + ":" + strconv.Itoa(attempt)},
			ID: id, BornUnixNano: msg.BornUnixNano, Origin: msg.Origin,
		}
		wait := d.retryWait(cause, attempt)
		at := m.b.time.Now().Add(wait)
		if checkDueTime(at) != nil {
			// No due time can hold the wait: the message goes to the
			// dead-letter topic, saying why, rather than come back early.
			return d.deadLetterOrRetry(r, msg, attempt, fmt.Errorf("%w (not retried: a retry after %v would be due after %s, the latest a due time can be)", cause, wait, MaxDeliverAt.UTC().Format(time.RFC3339)), try)
		}
		_, err = m.b.delay.place(r.hctx, em, QueueID{Topic: target, Queue: v.Queue % t.meta.Queues}, at, true)
	}
	if err != nil {
		m.report(&Error{Op: fmt.Sprintf("retry %s offset %d to %q (the message stays unfinished; trying again)", msg.QueueID(), msg.Offset, target), Err: err})
		d.schedule(&retryItem{r: r, msg: msg, attempt: attempt, cause: cause, tries: try + 1, resend: true, id: id,
			due: time.Now().Add(backoff(m.cfg.backoff, m.cfg.maxBackoff, try))})
		return false
	}
	d.retried.Add(1) // counted once written: one given back to the next owner is not a retry
	return true
}

// ensureRetry makes sure the retry topic exists and that the consumer
// reads it (nothing for a consumer of a retry topic: it writes to its
// own).
func (d *deliverer) ensureRetry(ctx context.Context) error {
	if d.c == nil {
		return nil
	}
	return d.c.ensureRetry(ctx, true)
}

// ensureRetry starts the consumer's member of its retry topic, creating
// the topic if create is set (else only if the topic exists), unless it
// runs; a closing consumer only creates the topic (a failure while it
// drains goes there, for the group's next members). The start is not
// under retryMu, so that a Close does not wait for it (it closes the
// member, which ends the start).
func (c *Consumer) ensureRetry(ctx context.Context, create bool) error {
	c.retryMu.Lock()
	if c.retry != nil {
		c.retryMu.Unlock()
		return nil
	}
	rc, err := c.newRetryMember(ctx, create)
	if rc == nil || err != nil || c.closing { // closing: the topic is made, the member not started
		c.retryMu.Unlock()
		return err
	}
	c.retry = rc
	c.retryMu.Unlock()
	if err := rc.Start(ctx); err != nil {
		rc.m.mu.Lock()
		joined := rc.m.state != memberNew
		rc.m.mu.Unlock()
		if !joined { // the next retry (or membership change) tries again
			c.retryMu.Lock()
			if c.retry == rc {
				c.retry = nil
			}
			c.retryMu.Unlock()
			_ = rc.Close()
			return &Error{Op: fmt.Sprintf("start reading retry topic %q", rc.m.topic), Err: err}
		}
	}
	return nil
}

// newRetryMember returns the consumer's member of its retry topic, not
// started, after creating the topic if create is set; nil if the topic
// does not exist and create is not set. c.retryMu is held.
func (c *Consumer) newRetryMember(ctx context.Context, create bool) (*Consumer, error) {
	m := c.m
	b := m.b
	name := m.cfg.retryTopic
	if _, err := b.topic(name); err != nil {
		if !errors.Is(err, ErrTopicNotFound) || !create {
			return nil, nil
		}
		t, err := b.topic(m.topic)
		if err != nil {
			return nil, err
		}
		if err := b.createSystemTopic(ctx, TopicMeta{Name: name, Queues: t.meta.Queues}); err != nil {
			return nil, err
		}
	}
	cfg := *m.cfg
	cfg.retryOf, cfg.retryTopic = m.topic, name
	if cfg.transactional {
		var err error
		if cfg.txnLog, err = TransactionLog(m.group, name); err != nil {
			return nil, err
		}
	}
	cfg.startFrom = Earliest                 // every retry written before it starts
	cfg.onAssigned, cfg.onRevoked = nil, nil // the user's queues are the topic's
	rc := &Consumer{m: newGroupMember(b, m.group, name, &cfg), h: c.h}
	rc.m.closeOwner = rc.Close
	rc.m.pausedBy = func(q int) bool { // paused as the consumer's queues are
		v := rc.m.view.Load()
		return v != nil && m.pausesRetryQueue(q, len(v.ids))
	}
	return rc, nil
}

// Permanent marks err as not worth retrying: the message goes to the
// dead-letter topic at once. The mark changes nothing of err's text
// ([HeaderError] holds it as the handler wrote it); [IsPermanent] finds
// it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

func (e *permanentError) Unwrap() error { return e.err }

// retryItem is a message waiting for its next attempt (concurrent mode),
// or, with a cause, for another try of its dead-letter send.
type retryItem struct {
	r       *queueRun
	msg     *EnhancedMessage
	attempt int // the attempt to make; with a cause, the attempts made
	due     time.Time
	cause   error     // the handler's last error, when the dead letter (or the retry write) failed
	tries   int       // with a cause, the send to make, from 2
	resend  bool      // with a cause: the write to the retry topic failed, not the dead letter
	id      MessageID // with resend: the ID of that write
}

// deadLetterOrRetry makes dead-letter send number try of msg, which failed
// attempts times with cause, and reports whether it went. If it did not,
// msg stays unfinished and in flight: another try is scheduled after a
// backoff, as for a failed handling.
func (d *deliverer) deadLetterOrRetry(r *queueRun, msg *EnhancedMessage, attempts int, cause error, try int) bool {
	if d.deadLetter(r, msg, attempts, cause) {
		return true
	}
	m := d.m
	d.schedule(&retryItem{r: r, msg: msg, attempt: attempts, cause: cause, tries: try + 1,
		due: time.Now().Add(backoff(m.cfg.backoff, m.cfg.maxBackoff, try))})
	return false
}

// IsPermanent reports whether err was marked with [Permanent] (anywhere
// in its chain): the consumer sends its message to the dead-letter topic
// without retrying. For hooks and middleware that report failures.
func IsPermanent(err error) bool { return isPermanent(err) }

func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// backoff returns the wait before attempt+1: base doubled per attempt
// after the first, capped at limit.
func backoff(base, limit time.Duration, attempt int) time.Duration {
	w := base
	for i := 1; i < attempt && w < limit; i++ {
		w *= 2
	}
	return min(w, limit)
}

// maxErrorHeader bounds the [HeaderError] value of a dead letter, in bytes:
// the headers the consumer adds to a dead letter take at most a few
// hundred bytes more.
const maxErrorHeader = 1024

// clip returns s cut to at most n bytes, on a UTF-8 boundary, marked "…"
// when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// deadLetter sends msg to the dead-letter topic, creating the topic (one
// queue) if needed, and reports whether it went (a failure is reported;
// the caller tries again).
func (d *deliverer) deadLetter(r *queueRun, msg *EnhancedMessage, attempts int, cause error) bool {
	m := d.m
	if !r.h.lands() {
		return false // the lease is gone: the caller leaves msg to the next owner
	}
	msg = d.view(msg)
	p, err := d.dlqProducer(r.hctx)
	var res SendResult
	if err == nil {
		h := make(map[string]string, len(msg.Headers)+7)
		maps.Copy(h, msg.Headers)
		h[HeaderOriginTopic] = msg.Topic
		h[HeaderOriginQueue] = strconv.Itoa(msg.Queue)
		h[HeaderOriginOffset] = strconv.FormatInt(msg.Offset, 10)
		h[HeaderOriginID] = msg.ID.String()
		h[HeaderGroup] = m.group
		h[HeaderAttempts] = strconv.Itoa(attempts)
		h[HeaderError] = clip(cause.Error(), maxErrorHeader)
		dl := &Message{Topic: m.cfg.deadLetter, Key: msg.Key, Tag: msg.Tag, Headers: h, Body: msg.Body}
		if dedupable(m.b, m.cfg.deadLetter) {
			// A dead letter written again (after a crash, before the
			// origin's cursor moved) is not stored twice.
			dl.DedupKey = "%dead:" + m.group + ":" + msg.QueueID().String() + ":" + strconv.FormatInt(msg.Offset, 10)
		}
		res, err = p.Send(r.hctx, dl)
	}
	if err != nil {
		m.report(&Error{Op: fmt.Sprintf("dead letter %s offset %d to %q (the message stays unfinished; trying again)", msg.QueueID(), msg.Offset, m.cfg.deadLetter), Err: err})
		return false
	}
	d.deadLettered.Add(1)
	m.hooks.onDeadLettered(msg, res, attempts, cause)
	m.b.log.Warn("ferry: dead letter", "group", m.group, "queue", msg.QueueID().String(), "offset", msg.Offset,
		"attempts", attempts, "topic", m.cfg.deadLetter, "err", cause)
	return true
}

func (d *deliverer) dlqProducer(ctx context.Context) (*Producer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.producer != nil {
		return d.producer, nil
	}
	b := d.m.b
	if err := d.m.createDeadLetter(ctx); err != nil {
		return nil, err
	}
	// No size bound of its own: a message a producer could send, plus the
	// headers added here, can always be dead-lettered (the queue's own
	// limits still apply; a refused send is retried and reported).
	p, err := b.NewProducer(WithProducerName(d.m.cfg.memberID), WithMaxMessageBytes(math.MaxInt), systemWriter())
	if err != nil {
		return nil, err
	}
	d.producer = p
	return p, nil
}

// schedule queues a retry for its due time, or abandons the message when
// its queue is being released: the next owner attempts it again, so a
// release never waits out a backoff.
func (d *deliverer) schedule(it *retryItem) {
	d.mu.Lock()
	if !it.r.h.serving() {
		d.mu.Unlock()
		it.r.buf.abandon(it.msg)
		return
	}
	heap.Push(&d.delayed, it)
	if !d.looping {
		d.looping = true
		d.m.wg.Add(1) // a worker calls schedule: the member's count is not zero
		go d.retryLoop()
	}
	d.mu.Unlock()
	select {
	case d.retryWake <- struct{}{}:
	default:
	}
}

// dropRetries abandons the retries waiting for r, which is being released
// (no longer served): their messages stay unfinished for the next owner.
func (d *deliverer) dropRetries(r *queueRun) {
	d.mu.Lock()
	var dropped []*EnhancedMessage
	kept := d.delayed[:0]
	for _, it := range d.delayed {
		if it.r == r {
			dropped = append(dropped, it.msg)
		} else {
			kept = append(kept, it)
		}
	}
	clear(d.delayed[len(kept):])
	d.delayed = kept
	heap.Init(&d.delayed)
	d.mu.Unlock()
	r.buf.abandon(dropped...)
	r.dropWaiting()
}

// retryLoop hands retries to the workers when they are due, until the
// consumer halts; retries still waiting then are dropped (their messages
// are unfinished, so the next owner gets them).
func (d *deliverer) retryLoop() {
	m := d.m
	defer m.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.mu.Lock()
		now := time.Now()
		for len(d.delayed) > 0 && !d.delayed[0].due.After(now) {
			m.sched.pushRetry(heap.Pop(&d.delayed).(*retryItem))
		}
		wait := time.Hour
		if len(d.delayed) > 0 {
			wait = d.delayed[0].due.Sub(now)
		}
		d.mu.Unlock()
		t.Reset(wait)
		select {
		case <-t.C:
		case <-d.retryWake:
		case <-m.halt:
			d.mu.Lock()
			clear(d.delayed)
			d.delayed = nil
			if d.producer != nil {
				_ = d.producer.Close()
			}
			d.mu.Unlock()
			return
		}
	}
}

type retryHeap []*retryItem

func (h retryHeap) Len() int { return len(h) }

func (h retryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }

func (h retryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *retryHeap) Push(x any) { *h = append(*h, x.(*retryItem)) }

func (h *retryHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

// dedupable reports whether every queue of topic deduplicates (see
// [Deduplicator]), so that a write with a DedupKey is taken.
func dedupable(b *Broker, topic string) bool {
	t, err := b.topic(topic)
	if err != nil {
		return false
	}
	for _, q := range t.queues {
		if _, ok := q.(Deduplicator); !ok {
			return false
		}
	}
	return true
}
