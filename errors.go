package ferry

import (
	"errors"
	"strconv"
	"strings"
)

// Sentinel errors. Every error Ferry returns wraps one of these (or a
// context error), so callers match them with [errors.Is]. Their text has
// no "ferry:" prefix: the [Error] that wraps them adds it, once.
var (
	// ErrClosed is returned by every method of a producer, consumer, broker,
	// queue or store after its Close.
	ErrClosed = errors.New("closed")
	// ErrTopicNotFound is returned when a message names a topic the broker
	// does not hold.
	ErrTopicNotFound = errors.New("topic not found")
	// ErrTopicExists is returned by CreateTopic when a topic of that name
	// exists with different metadata.
	ErrTopicExists = errors.New("topic exists with different metadata")
	// ErrInvalidTopic is returned for a topic name or metadata that breaks
	// the rules of [ValidateTopicName] or [TopicMeta.Validate].
	ErrInvalidTopic = errors.New("invalid topic")
	// ErrInvalidMessage is returned for a nil message or a message that
	// cannot be sent as it is (a typed value that does not encode
	// included), and wrapped by the error of a body a typed consumer
	// cannot decode (see [TypedHandler]).
	ErrInvalidMessage = errors.New("invalid message")
	// ErrMessageTooLarge is returned when a message is larger than the
	// producer's maximum (see [WithMaxMessageBytes]).
	ErrMessageTooLarge = errors.New("message too large")
	// ErrOffsetOutOfRange is returned by a read below the oldest retained
	// offset of a queue, or beyond its next offset.
	ErrOffsetOutOfRange = errors.New("offset out of range")
	// ErrQueueFull is returned by the non-blocking variants (TrySend,
	// TryWrite) when a back-pressured queue has no room.
	ErrQueueFull = errors.New("queue full")
	// ErrCorrupt is returned for bytes that fail to decode: a bad checksum,
	// a length out of bounds, an unknown version.
	ErrCorrupt = errors.New("corrupt data")
	// ErrInvalidOption is returned by a constructor given an option value
	// out of range, and by any call given a nil context.
	ErrInvalidOption = errors.New("invalid option")
	// ErrInvalidRoute is returned when a Router returns an error or an index
	// out of range; the error names the router.
	ErrInvalidRoute = errors.New("invalid route")
	// ErrInvalidAllocation is reported (see WithOnError) when an Allocator's
	// split of a group's queues leaves a queue unowned or gives it to more
	// than one member; the error names the allocator.
	ErrInvalidAllocation = errors.New("invalid allocation")
	// ErrGroupActive is returned by [Broker.ForgetGroup] for a group that
	// still has live members.
	ErrGroupActive = errors.New("group has live members")
	// ErrGroupNotFound is returned by [Broker.Lag] for a group with
	// neither a committed cursor nor a live member on the topic.
	ErrGroupNotFound = errors.New("group not found")
	// ErrSessionExpired is returned by a [Session] that ended (left,
	// expired, or its coordinator closed).
	ErrSessionExpired = errors.New("session expired")
	// ErrFenced is returned by [FencedCursorStore.CommitFenced] when a
	// commit with a higher fencing token went in first: the committer's
	// lease is stale, and it wrote nothing.
	ErrFenced = errors.New("fenced")

	// ErrOutboxDone is an [Outbox] Send after its handler call returned.
	ErrOutboxDone = errors.New("outbox done: the handler call returned")
)

// Error is the error of an operation of Ferry or of one of its stores,
// as [fs.PathError] is of a file system's: Op names what was being done
// and to what ("send", `create topic "orders"`, "filestore: open /data"),
// Err why it failed. Every error Ferry returns is an *Error (or several,
// joined), and wraps one of the sentinels above or a context error, which
// [errors.Is] finds; the helpers for store implementers (the validators,
// package codec) return the bare reason, for the store to wrap in its own
// *Error.
//
// Its text is "ferry: " then Op, then Err's: an *Error directly inside
// another adds its Op without a second prefix ("ferry: send: write
// orders[1]: closed"), so a chain reads with one "ferry:"; any other error
// (a user's, a store's, the operating system's) is quoted as it is. A store
// or coordinator in another package returns an *Error with its own name
// first in Op ("mystore: write orders[1]") and its errors read the same.
type Error struct {
	Op  string // the operation, and what it acted on
	Err error  // why it failed; nil when Op says it all
}

func (e *Error) Error() string { return "ferry: " + e.body() }

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// body is e's text without the prefix.
func (e *Error) body() string {
	switch {
	case e.Err == nil:
		return e.Op
	case e.Op == "":
		return bodyOf(e.Err)
	}
	return e.Op + ": " + bodyOf(e.Err)
}

// bodyOf is err's text inside an *Error: without the prefix for Ferry's
// own errors, as it is for any other.
func bodyOf(err error) string {
	if b, ok := err.(interface{ body() string }); ok {
		return b.body()
	}
	return err.Error()
}

// joinErrors is [errors.Join] for Ferry's errors: nil when every one is,
// the error itself when only one is not; inside an *Error the errors read
// as one line ("ferry: seek: orders[0]: closed; orders[1]: ..."), alone
// one error per line as errors.Join's.
func joinErrors(errs ...error) error {
	var out multiError
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}

// multiError is several errors (see joinErrors).
type multiError []error

func (m multiError) Error() string {
	var b strings.Builder
	for i, err := range m {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (m multiError) body() string {
	var b strings.Builder
	for i, err := range m {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(bodyOf(err))
	}
	return b.String()
}

func (m multiError) Unwrap() []error { return m }

// topicNotFound is "ferry: topic: topic not found: <name>", wrapping
// [ErrTopicNotFound], formatted only when read: looking up a topic that
// does not exist is common (a consumer's retry topic, at Start) and
// costs no formatting.
type topicNotFound struct{ name string }

func (e *topicNotFound) Error() string { return "ferry: " + e.body() }

func (e *topicNotFound) body() string {
	return "topic: " + ErrTopicNotFound.Error() + ": " + strconv.Quote(e.name)
}

func (e *topicNotFound) Unwrap() error { return ErrTopicNotFound }
