package ferry

import (
	"context"
	"time"
)

// Hook is a value that observes Ferry's events, for metrics and tracing:
// it implements any of the Hook* interfaces of this file, and is called
// for the events whose interfaces it implements. Register hooks on a
// broker ([WithHooks]: every producer and consumer made from it) or on one
// producer or consumer ([WithProducerHooks], [WithConsumerHooks]: its
// events only). For each event the broker's hooks are called first, in
// the order they were given, then the producer's or consumer's own, in
// theirs; a nil hook is skipped. A consumer's dead-letter sends go
// through a producer of the broker's, which has the broker's hooks only.
// A hook is called from the goroutine of the event (a Send's, a
// worker's, a queue's), concurrently for concurrent events, and must not
// block; a panic in a hook is not recovered. With no hook registered the
// hot paths pay a nil check.
type Hook any

// HookSend is called for each message a producer is about to write,
// stamped and routed (em.Queue set, no offset yet). It may add headers,
// trace context say, by giving em a new Headers map: the map em shares
// with the sender's [Message] must not be changed.
type HookSend interface {
	OnSend(ctx context.Context, em *EnhancedMessage)
}

// HookSent is called for each message [HookSend] saw, once the producer
// wrote it (em with its offset and StoreTime) or failed to (err). A
// message refused before it is stamped (a nil message, an unknown topic,
// one too large, a bad route) reaches neither.
type HookSent interface {
	OnSent(ctx context.Context, em *EnhancedMessage, err error)
}

// HookHandle is called before each handler call of a push consumer, with
// the handler's context (whose [Delivery] says the group, member and
// attempt). It returns the context the handler gets: ctx itself, or one
// derived from it (with a span, say); nil keeps ctx.
type HookHandle interface {
	OnHandle(ctx context.Context, m *EnhancedMessage) context.Context
}

// HookHandled is called after each handler call, with the context
// [HookHandle] returned, how long the call took and its error (a panic
// is an error).
type HookHandled interface {
	OnHandled(ctx context.Context, m *EnhancedMessage, took time.Duration, err error)
}

// CommitEvent is a cursor commit of a consumer.
type CommitEvent struct {
	Group  string // the cursor group (see [GroupLag.Group])
	Member string
	Queue  QueueID
	Offset int64 // the next offset to consume
	Took   time.Duration
	Err    error
}

// HookCommitted is called after each cursor commit of a consumer.
type HookCommitted interface {
	OnCommitted(e CommitEvent)
}

// HookDeadLettered is called after a message went to the dead-letter
// topic (dl says where), having failed attempts times with cause.
type HookDeadLettered interface {
	OnDeadLettered(m *EnhancedMessage, dl SendResult, attempts int, cause error)
}

// HookRebalanced is called when a consumer took a queue (assigned true,
// before fetching from it) or gave it up (false, after its drain and
// commit, before unlocking it).
type HookRebalanced interface {
	OnRebalanced(group, member string, q QueueID, assigned bool)
}

// HookReset is called when a consumer's cursor fell out of the retained
// range and was reset (see [WithOnReset]).
type HookReset interface {
	OnReset(group string, q QueueID, from, to int64)
}

// hookSet holds registered hooks by event. A nil *hookSet has none.
type hookSet struct {
	send         []HookSend
	sent         []HookSent
	handle       []HookHandle
	handled      []HookHandled
	committed    []HookCommitted
	deadLettered []HookDeadLettered
	rebalanced   []HookRebalanced
	reset        []HookReset
}

// newHookSet sorts hooks by event after those of base; nil if there is
// none.
func newHookSet(base *hookSet, hooks []Hook) *hookSet {
	if len(hooks) == 0 {
		return base
	}
	s := &hookSet{}
	if base != nil {
		*s = *base
		s.send = append([]HookSend(nil), base.send...)
		s.sent = append([]HookSent(nil), base.sent...)
		s.handle = append([]HookHandle(nil), base.handle...)
		s.handled = append([]HookHandled(nil), base.handled...)
		s.committed = append([]HookCommitted(nil), base.committed...)
		s.deadLettered = append([]HookDeadLettered(nil), base.deadLettered...)
		s.rebalanced = append([]HookRebalanced(nil), base.rebalanced...)
		s.reset = append([]HookReset(nil), base.reset...)
	}
	for _, h := range hooks {
		if h, ok := h.(HookSend); ok {
			s.send = append(s.send, h)
		}
		if h, ok := h.(HookSent); ok {
			s.sent = append(s.sent, h)
		}
		if h, ok := h.(HookHandle); ok {
			s.handle = append(s.handle, h)
		}
		if h, ok := h.(HookHandled); ok {
			s.handled = append(s.handled, h)
		}
		if h, ok := h.(HookCommitted); ok {
			s.committed = append(s.committed, h)
		}
		if h, ok := h.(HookDeadLettered); ok {
			s.deadLettered = append(s.deadLettered, h)
		}
		if h, ok := h.(HookRebalanced); ok {
			s.rebalanced = append(s.rebalanced, h)
		}
		if h, ok := h.(HookReset); ok {
			s.reset = append(s.reset, h)
		}
	}
	return s
}

func (s *hookSet) onSend(ctx context.Context, em *EnhancedMessage) {
	if s == nil {
		return
	}
	for _, h := range s.send {
		h.OnSend(ctx, em)
	}
}

func (s *hookSet) onSent(ctx context.Context, em *EnhancedMessage, err error) {
	if s == nil {
		return
	}
	for _, h := range s.sent {
		h.OnSent(ctx, em, err)
	}
}

func (s *hookSet) onCommitted(e CommitEvent) {
	if s == nil {
		return
	}
	for _, h := range s.committed {
		h.OnCommitted(e)
	}
}

func (s *hookSet) onDeadLettered(m *EnhancedMessage, dl SendResult, attempts int, cause error) {
	if s == nil {
		return
	}
	for _, h := range s.deadLettered {
		h.OnDeadLettered(m, dl, attempts, cause)
	}
}

func (s *hookSet) onRebalanced(group, member string, q QueueID, assigned bool) {
	if s == nil {
		return
	}
	for _, h := range s.rebalanced {
		h.OnRebalanced(group, member, q, assigned)
	}
}

func (s *hookSet) onReset(group string, q QueueID, from, to int64) {
	if s == nil {
		return
	}
	for _, h := range s.reset {
		h.OnReset(group, q, from, to)
	}
}

// WithHooks registers hooks for every producer and consumer made from
// the broker (see [Hook]). Default: none.
func WithHooks(hooks ...Hook) BrokerOption {
	return func(c *brokerConfig) { c.hooks = append(c.hooks, hooks...) }
}

// WithProducerHooks registers hooks for this producer's sends only
// ([HookSend] and [HookSent]), called after the broker's for each message
// (see [Hook]). Default: none.
func WithProducerHooks(hooks ...Hook) ProducerOption {
	return func(c *producerConfig) { c.hooks = append(c.hooks, hooks...) }
}

// WithConsumerHooks registers hooks for this consumer's events only,
// called after the broker's for each (see [Hook]). Default: none. For
// push and pull consumers (a
// pull consumer has no handler calls: [HookHandle] and [HookHandled] are
// not called for it).
func WithConsumerHooks(hooks ...Hook) GroupOption {
	return groupOption(func(c *consumerConfig) { c.hooks = append(c.hooks, hooks...) })
}
