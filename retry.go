package ferry

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"
	"time"
)

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

// RetryTopic returns the name of the topic where a group's retries of
// topic's messages wait: "%RETRY%<group>%<topic>", or a hash of both when
// that is not a valid topic name.
func RetryTopic(group, topic string) string {
	name := "%RETRY%" + group + "%" + topic
	if ValidateTopicName(name) == nil {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(group))
	h.Write([]byte{0})
	h.Write([]byte(topic))
	return fmt.Sprintf("%%RETRY%%%016x", h.Sum64())
}

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
	return !m.cfg.ordered && !m.cfg.broadcast && !m.pull && m.cfg.maxAttempts > 1
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
			Message: Message{Topic: target, Key: msg.Key, Tag: msg.Tag, Headers: h, Body: msg.Body},
			ID:      id, BornUnixNano: msg.BornUnixNano, Origin: msg.Origin,
		}
		at := m.b.time.Now().Add(d.retryWait(cause, attempt))
		_, err = m.b.delay.place(r.hctx, em, QueueID{Topic: target, Queue: v.Queue % t.meta.Queues}, at, true)
	}
	if err != nil {
		m.report(&Error{Op: fmt.Sprintf("retry %s offset %d to %q (the message stays unfinished; trying again)", msg.QueueID(), msg.Offset, target), Err: err})
		d.schedule(&retryItem{r: r, msg: msg, attempt: attempt, cause: cause, tries: try + 1, resend: true, id: id,
			due: time.Now().Add(backoff(m.cfg.backoff, m.cfg.maxBackoff, try))})
		return false
	}
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
		err = b.CreateTopic(ctx, TopicMeta{Name: name, Queues: t.meta.Queues})
		if err != nil && !errors.Is(err, ErrTopicExists) {
			return nil, err
		}
	}
	cfg := *m.cfg
	cfg.retryOf, cfg.retryTopic = m.topic, name
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
