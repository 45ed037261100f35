package ferry

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Sentinel errors. Every error Ferry returns wraps one of these (or a
// context error), so callers match them with [errors.Is].
var (
	// ErrClosed is returned by every method of a producer, consumer, broker,
	// queue or store after its Close.
	ErrClosed = errors.New("ferry: closed")
	// ErrTopicNotFound is returned when a message names a topic the broker
	// does not hold.
	ErrTopicNotFound = errors.New("ferry: topic not found")
	// ErrTopicExists is returned by CreateTopic when a topic of that name
	// exists with different metadata.
	ErrTopicExists = errors.New("ferry: topic exists with different metadata")
	// ErrInvalidTopic is returned for a topic name or metadata that breaks
	// the rules of [ValidateTopicName] or [TopicMeta.Validate].
	ErrInvalidTopic = errors.New("ferry: invalid topic")
	// ErrInvalidMessage is returned for a nil message or a message that
	// cannot be sent as it is.
	ErrInvalidMessage = errors.New("ferry: invalid message")
	// ErrMessageTooLarge is returned when a message is larger than the
	// producer's maximum (see [WithMaxMessageBytes]).
	ErrMessageTooLarge = errors.New("ferry: message too large")
	// ErrOffsetOutOfRange is returned by a read below the oldest retained
	// offset of a queue, or beyond its next offset.
	ErrOffsetOutOfRange = errors.New("ferry: offset out of range")
	// ErrQueueFull is returned by the non-blocking variants (TrySend,
	// TryWrite) when a back-pressured queue has no room.
	ErrQueueFull = errors.New("ferry: queue full")
	// ErrCorrupt is returned for bytes that fail to decode: a bad checksum,
	// a length out of bounds, an unknown version.
	ErrCorrupt = errors.New("ferry: corrupt data")
	// ErrInvalidOption is returned by a constructor given an option value
	// out of range, and by any call given a nil context.
	ErrInvalidOption = errors.New("ferry: invalid option")
	// ErrInvalidRoute is returned when a Router returns an error or an index
	// out of range; the error names the router.
	ErrInvalidRoute = errors.New("ferry: invalid route")
	// ErrInvalidAllocation is reported (see WithOnError) when an Allocator's
	// split of a group's queues leaves a queue unowned or gives it to more
	// than one member; the error names the allocator.
	ErrInvalidAllocation = errors.New("ferry: invalid allocation")
	// ErrGroupActive is returned by [Broker.ForgetGroup] for a group that
	// still has live members.
	ErrGroupActive = errors.New("ferry: group has live members")
	// ErrGroupNotFound is returned by [Broker.Lag] for a group with
	// neither a committed cursor nor a live member on the topic.
	ErrGroupNotFound = errors.New("ferry: group not found")
	// ErrSessionExpired is returned by a [Session] that ended (left,
	// expired, or its coordinator closed).
	ErrSessionExpired = errors.New("ferry: session expired")
	// ErrFenced is returned by [FencedCursorStore.CommitFenced] when a
	// commit with a higher fencing token went in first: the committer's
	// lease is stale, and it wrote nothing.
	ErrFenced = errors.New("ferry: fenced")
)

// Errorf is [fmt.Errorf] for the errors Ferry returns, and for those of
// implementations of its seams (stores, coordinators): the text keeps one
// "ferry:" prefix per chain, dropping those of the errors it wraps
// ("ferry: poll: start pull consumer: closed", not "ferry: poll: ferry:
// start pull consumer: ferry: closed"), while [errors.Is] and
// [errors.As] still see every wrapped error.
func Errorf(format string, args ...any) error { return errorf(format, args...) }

// errorf is [Errorf].
func errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	msg := err.Error()
	if !strings.Contains(msg, ": ferry: ") {
		return err
	}
	return &chainError{msg: strings.ReplaceAll(msg, ": ferry: ", ": "), err: err}
}

// chainError is an error chain whose text errorf cleaned up.
type chainError struct {
	msg string
	err error
}

func (e *chainError) Error() string { return e.msg }
func (e *chainError) Unwrap() error { return e.err }

// topicNotFound is "ferry: topic: topic not found: <name>", wrapping
// [ErrTopicNotFound], formatted only when read: looking up a topic that
// does not exist is common (a consumer's retry topic, at Start) and
// costs no formatting.
type topicNotFound struct{ name string }

func (e *topicNotFound) Error() string {
	return "ferry: topic: " + strings.TrimPrefix(ErrTopicNotFound.Error(), "ferry: ") + ": " + strconv.Quote(e.name)
}

func (e *topicNotFound) Unwrap() error { return ErrTopicNotFound }
