package ferry

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"reflect"
	"time"
)

// Typed messages: a user sends and handles values of a Go type T, not
// bytes. A [BodyCodec] turns a T into a message body and back
// ([JSONCodec] by default; module github.com/ferrymq/ferry/protocodec
// has protobuf's). [TypedProducer] encodes and sends over a [Producer],
// [TypedHandler] decodes for a push [Consumer], [TypedPullConsumer] for a
// [PullConsumer]. They are thin wrappers over the public API: everything
// else (routing, retries, dead letters, delays, deduplication) is the
// wrapped producer's or consumer's.

// BodyCodec turns values of type T into message bodies and back. (Package
// codec is something else: the binary encoding of a whole message, for
// stores.)
//
// Encode returns the body for v; the caller owns the slice, and Encode
// must not keep it. Decode returns the value of body, which it must not
// modify or keep (the stored message shares it, with every group
// reading the topic); an error from Decode means the body is not a T,
// now or ever: the message is not retried (see [TypedHandler]). Both must
// be safe for concurrent use: a consumer decodes on several goroutines.
type BodyCodec[T any] interface {
	Encode(v T) ([]byte, error)
	Decode(body []byte) (T, error)
}

// JSONCodec is the [BodyCodec] of package encoding/json, the default of
// the typed wrappers: Encode is json.Marshal, Decode json.Unmarshal into a
// fresh T (unknown fields are ignored, as json.Unmarshal does). Its zero
// value is ready to use.
type JSONCodec[T any] struct{}

var _ BodyCodec[struct{}] = JSONCodec[struct{}]{}

// Encode returns the JSON encoding of v.
func (JSONCodec[T]) Encode(v T) ([]byte, error) { return json.Marshal(v) }

// Decode returns the T that body encodes.
func (JSONCodec[T]) Decode(body []byte) (T, error) {
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// TypedOption configures a typed wrapper ([NewTypedProducer],
// [TypedHandler], [NewTypedPullConsumer]) of values of type T.
type TypedOption[T any] func(*typedConfig[T])

// WithBodyCodec sets the codec of a typed wrapper. Default (and for nil,
// as [WithRouter](nil) is the default router): [JSONCodec][T]. T is
// inferred from c, so
//
//	ferry.NewTypedProducer(p, ferry.WithBodyCodec(protocodec.Codec[*pb.Order]{}))
//
// needs no type argument.
func WithBodyCodec[T any](c BodyCodec[T]) TypedOption[T] {
	return func(cfg *typedConfig[T]) { cfg.codec = c }
}

// typedConfig is what a typed wrapper of T works with.
type typedConfig[T any] struct {
	codec BodyCodec[T]
	// nilable: T is a pointer or an interface type, whose nil value is
	// refused on both sides (see checkValue).
	nilable bool
}

func newTypedConfig[T any](opts []TypedOption[T]) typedConfig[T] {
	var c typedConfig[T]
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.codec == nil {
		c.codec = JSONCodec[T]{}
	}
	k := reflect.TypeFor[T]().Kind()
	c.nilable = k == reflect.Pointer || k == reflect.Interface
	return c
}

// isNil reports whether v is a nil pointer or a nil interface; only
// called when c.nilable.
func (c *typedConfig[T]) isNil(v T) bool {
	a := any(v)
	if a == nil {
		return true // a nil interface
	}
	rv := reflect.ValueOf(a)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// encode returns the body of v, or an error wrapping ErrInvalidMessage.
func (c *typedConfig[T]) encode(v T) ([]byte, error) {
	if c.nilable && c.isNil(v) {
		return nil, fmt.Errorf("%w: nil %s value", ErrInvalidMessage, reflect.TypeFor[T]())
	}
	body, err := c.codec.Encode(v)
	if err != nil {
		return nil, fmt.Errorf("%w: encode with %T: %w", ErrInvalidMessage, c.codec, err)
	}
	return body, nil
}

// decode returns the value of m's body, or an *Error wrapping
// ErrInvalidMessage and the codec's error that names the message and
// the codec. A panicking codec is a failed decode: the same bytes would
// panic again.
func (c *typedConfig[T]) decode(m *EnhancedMessage) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			var zero T
			v, err = zero, c.decodeError(m, fmt.Errorf("codec panicked: %v", r))
		}
	}()
	v, err = c.codec.Decode(m.Body)
	if err == nil && c.nilable && c.isNil(v) {
		err = fmt.Errorf("body %q decodes to a nil %s", clip(string(m.Body), 64), reflect.TypeFor[T]())
	}
	if err != nil {
		var zero T
		return zero, c.decodeError(m, err)
	}
	return v, nil
}

func (c *typedConfig[T]) decodeError(m *EnhancedMessage, err error) error {
	return &Error{
		Op:  fmt.Sprintf("decode %s offset %d with %T", m.QueueID(), m.Offset, c.codec),
		Err: fmt.Errorf("%w: %w", ErrInvalidMessage, err),
	}
}

// TypedMessage is a [Message] whose body is a value of type T: what a
// [TypedProducer] sends. Its fields other than Value are those of
// Message, with the same meaning; Value is encoded into the body.
//
// The caller must not modify a TypedMessage's Headers after passing it
// to a send, as for a Message; Value is encoded before the send returns
// and may then be reused.
type TypedMessage[T any] struct {
	// Topic names the topic the message goes to. Required.
	Topic string
	// Key routes the message (see [Message].Key).
	Key string
	// Tag is a short label consumers can filter on (see [WithTags]).
	Tag string
	// Headers carry user metadata.
	Headers map[string]string
	// Value is encoded, with the producer's [BodyCodec], into the body.
	Value T
	// DedupKey, when not empty, makes the write idempotent (see
	// [Message].DedupKey).
	DedupKey string
	// DeliverAt, when after the broker's clock reads now, delays the
	// message (see [Message].DeliverAt).
	DeliverAt time.Time
}

// TypedProducer sends values of type T over a [Producer]: it encodes each
// [TypedMessage]'s Value with its [BodyCodec] and sends the message as
// the producer's method of the same name would. A value that does not
// encode is bad input: the call returns an error wrapping
// [ErrInvalidMessage] (and the codec's error) and sends nothing; so is a
// nil value of a pointer or interface type T (a nil *Order would reach a
// handler as "null" or an empty message; slices and maps are the codec's
// to encode, nil ones too). It does not own the producer: close that
// when done. A TypedProducer is safe for concurrent use if its codec is.
type TypedProducer[T any] struct {
	p   *Producer
	cfg typedConfig[T]
}

// NewTypedProducer returns a typed producer of T over p, encoding with
// [JSONCodec] unless [WithBodyCodec] says otherwise. A nil p is
// [ErrInvalidOption].
func NewTypedProducer[T any](p *Producer, opts ...TypedOption[T]) (*TypedProducer[T], error) {
	if p == nil {
		return nil, &Error{Op: "new typed producer", Err: fmt.Errorf("%w: nil producer", ErrInvalidOption)}
	}
	return &TypedProducer[T]{p: p, cfg: newTypedConfig(opts)}, nil
}

// Producer returns the producer tp sends with.
func (tp *TypedProducer[T]) Producer() *Producer { return tp.p }

// message fills dst with m, its Value encoded (bad input: an error as
// the producer's own, nothing sent). dst is the caller's, on its stack
// where the producer lets it be.
func (tp *TypedProducer[T]) message(dst *Message, m *TypedMessage[T]) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	body, err := tp.cfg.encode(m.Value)
	if err != nil {
		return err
	}
	*dst = Message{Topic: m.Topic, Key: m.Key, Tag: m.Tag, Headers: m.Headers, Body: body,
		DedupKey: m.DedupKey, DeliverAt: m.DeliverAt}
	return nil
}

// Send encodes m's Value and sends m as [Producer.Send] does, returning
// where it landed. Bad input (nil m, a value that does not encode) is
// [ErrInvalidMessage], with nothing sent.
func (tp *TypedProducer[T]) Send(ctx context.Context, m *TypedMessage[T]) (SendResult, error) {
	if err := checkContext(ctx); err != nil {
		return SendResult{}, &Error{Op: "send", Err: err}
	}
	var msg Message
	if err := tp.message(&msg, m); err != nil {
		return SendResult{}, &Error{Op: "send", Err: err}
	}
	return tp.p.Send(ctx, &msg)
}

// TrySend is Send that never waits for room (see [Producer.TrySend]).
func (tp *TypedProducer[T]) TrySend(m *TypedMessage[T]) (SendResult, error) {
	var msg Message
	if err := tp.message(&msg, m); err != nil {
		return SendResult{}, &Error{Op: "try send", Err: err}
	}
	return tp.p.TrySend(&msg)
}

// SendBatch encodes every message's Value, then sends them as
// [Producer.SendBatch] does (one Write per target queue; the results in
// the order of msgs). A message that is nil or does not encode fails the
// whole batch before anything is sent; the error names its index.
func (tp *TypedProducer[T]) SendBatch(ctx context.Context, msgs []*TypedMessage[T]) ([]SendResult, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "send batch", Err: err}
	}
	all := make([]Message, len(msgs))
	out := make([]*Message, len(msgs))
	for i, m := range msgs {
		if err := tp.message(&all[i], m); err != nil {
			return nil, &Error{Op: fmt.Sprintf("send batch: message %d", i), Err: err}
		}
		out[i] = &all[i]
	}
	return tp.p.SendBatch(ctx, out)
}

// SendAsync encodes m's Value and sends m as [Producer.SendAsync] does:
// bad input (a value that does not encode included) is its error, and
// done is then never called; otherwise done is called once, with where
// the message landed or why not, under the rules of Producer.SendAsync.
func (tp *TypedProducer[T]) SendAsync(ctx context.Context, m *TypedMessage[T], done func(SendResult, error)) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "send async", Err: err}
	}
	var msg Message
	if err := tp.message(&msg, m); err != nil {
		return &Error{Op: "send async", Err: err}
	}
	return tp.p.SendAsync(ctx, &msg, done)
}

// TypedHandler returns a [Handler] that decodes each message's body into
// a T with the codec ([JSONCodec] unless [WithBodyCodec] says otherwise)
// and calls f with the value and the message (for its key, headers,
// offset...; the body is the encoded value). f's error is the handler's:
// retried, dead-lettered, [Permanent] or [RetryAfter] as any handler's.
// ctx carries the [Delivery] as for any handler.
//
// A body that does not decode (the codec's error, a panic of the codec,
// or a nil value of a pointer or interface type T) is a permanent
// failure: f is not called, and the message goes to the consumer's
// dead-letter topic at once, without retries, its [HeaderError] reading
// "ferry: decode <topic>[<queue>] offset <n> with <codec type>: invalid
// message: <the codec's error>" (the error wraps [ErrInvalidMessage] and
// the codec's error, marked [Permanent]).
//
// A nil f gives a nil Handler, which [Broker.NewConsumer] refuses with
// [ErrInvalidOption].
func TypedHandler[T any](f func(ctx context.Context, v T, m *EnhancedMessage) error, opts ...TypedOption[T]) Handler {
	if f == nil {
		return nil
	}
	return &typedHandler[T]{f: f, cfg: newTypedConfig(opts)}
}

type typedHandler[T any] struct {
	f   func(ctx context.Context, v T, m *EnhancedMessage) error
	cfg typedConfig[T]
}

var _ Handler = (*typedHandler[int])(nil)

func (h *typedHandler[T]) Handle(ctx context.Context, m *EnhancedMessage) error {
	v, err := h.cfg.decode(m)
	if err != nil {
		return Permanent(err)
	}
	return h.f(ctx, v, m)
}

// Received is a message a [TypedPullConsumer] got: the message and its
// decoded value, or the error that says why its body did not decode.
type Received[T any] struct {
	// Value is the decoded body; the zero T when Err is not nil.
	Value T
	// Msg is the message as the pull consumer got it: commit it (see
	// [TypedPullConsumer.Commit]) whether or not it decoded.
	Msg *EnhancedMessage
	// Err, when not nil, is why the body did not decode: an [*Error]
	// wrapping [ErrInvalidMessage] and the codec's error, as for
	// [TypedHandler].
	Err error
}

// TypedPullConsumer is a typed view of a [PullConsumer]: its Poll and
// Messages decode each message's body into a T with the codec
// ([JSONCodec] unless [WithBodyCodec] says otherwise).
//
// A message that does not decode is handed out all the same, with its
// error (see [Received]): the caller decides what becomes of it, as a pull
// consumer has no dead-letter topic of its own (send it to one of yours,
// log it) and commits it like any other, or it comes back after a
// rebalance or restart; with [WithAutoCommit] it is finished as any other
// message is. Nothing is skipped silently.
//
// The view does not own the consumer: Start and Close that. A
// TypedPullConsumer is safe for concurrent use if its codec is.
type TypedPullConsumer[T any] struct {
	c   *PullConsumer
	cfg typedConfig[T]
}

// NewTypedPullConsumer returns a typed view of c. A nil c is
// [ErrInvalidOption].
func NewTypedPullConsumer[T any](c *PullConsumer, opts ...TypedOption[T]) (*TypedPullConsumer[T], error) {
	if c == nil {
		return nil, &Error{Op: "new typed pull consumer", Err: fmt.Errorf("%w: nil pull consumer", ErrInvalidOption)}
	}
	return &TypedPullConsumer[T]{c: c, cfg: newTypedConfig(opts)}, nil
}

// PullConsumer returns the consumer tc reads.
func (tc *TypedPullConsumer[T]) PullConsumer() *PullConsumer { return tc.c }

func (tc *TypedPullConsumer[T]) received(m *EnhancedMessage) Received[T] {
	v, err := tc.cfg.decode(m)
	return Received[T]{Value: v, Msg: m, Err: err}
}

// Poll is [PullConsumer.Poll], each message decoded: it returns up to max
// messages, those that did not decode among them with their Err set. The
// error is Poll's own (ctx's, [ErrClosed], ...), never a decode error.
func (tc *TypedPullConsumer[T]) Poll(ctx context.Context, max int) ([]Received[T], error) {
	msgs, err := tc.c.Poll(ctx, max)
	if err != nil {
		return nil, err
	}
	out := make([]Received[T], len(msgs))
	for i, m := range msgs {
		out[i] = tc.received(m)
	}
	return out, nil
}

// Messages is [PullConsumer.Messages], each message decoded. A message
// that did not decode is yielded as (r, r.Err), r.Msg set, and the loop
// goes on; the end of the loop (ctx done, the consumer closed) is yielded
// as a zero Received, whose Msg is nil, with that error, as
// PullConsumer.Messages does.
func (tc *TypedPullConsumer[T]) Messages(ctx context.Context) iter.Seq2[Received[T], error] {
	return func(yield func(Received[T], error) bool) {
		for m, err := range tc.c.Messages(ctx) {
			if err != nil {
				yield(Received[T]{}, err)
				return
			}
			r := tc.received(m)
			if !yield(r, r.Err) {
				return
			}
		}
	}
}

// Commit is [PullConsumer.Commit] of the messages of rs, decoded or not.
func (tc *TypedPullConsumer[T]) Commit(ctx context.Context, rs ...Received[T]) error {
	msgs := make([]*EnhancedMessage, len(rs))
	for i, r := range rs {
		msgs[i] = r.Msg
	}
	return tc.c.Commit(ctx, msgs...)
}
