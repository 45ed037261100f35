package ferryotel

import (
	"context"
	"errors"
	"strconv"

	"github.com/ferrymq/ferry"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Attributes of this package beyond the messaging semantic conventions.
const (
	// OffsetKey is a message's offset in its queue.
	OffsetKey = attribute.Key("ferry.message.offset")
	// KeyKey and TagKey are a message's routing key and tag, when set.
	KeyKey = attribute.Key("ferry.message.key")
	TagKey = attribute.Key("ferry.message.tag")
	// AttemptKey is the attempt a process span is of, from 1.
	AttemptKey = attribute.Key("ferry.delivery.attempt")
	// MaxAttemptsKey is the attempt after which a failure dead-letters.
	MaxAttemptsKey = attribute.Key("ferry.delivery.max_attempts")
	// MemberKey is the consumer's member ID in its group.
	MemberKey = attribute.Key("ferry.consumer.member")
	// AssignedKey says whether a rebalance took a queue (true) or gave
	// it up (false).
	AssignedKey = attribute.Key("ferry.consumer.assigned")

	// DeadLetterTopicKey, DeadLetterPartitionKey and DeadLetterOffsetKey
	// say where a dead letter went (on a dead-letter span).
	DeadLetterTopicKey     = attribute.Key("ferry.dead_letter.topic")
	DeadLetterPartitionKey = attribute.Key("ferry.dead_letter.partition.id")
	DeadLetterOffsetKey    = attribute.Key("ferry.dead_letter.offset")
	// DeadLetterAttemptsKey is how many times the message failed before
	// it was dead-lettered.
	DeadLetterAttemptsKey = attribute.Key("ferry.dead_letter.attempts")

	// OriginTopicKey, OriginPartitionKey and OriginOffsetKey say, on the
	// send span of a dead letter, which message it is the dead letter of
	// (from its [ferry.HeaderOriginTopic] headers).
	OriginTopicKey     = attribute.Key("ferry.origin.topic")
	OriginPartitionKey = attribute.Key("ferry.origin.partition.id")
	OriginOffsetKey    = attribute.Key("ferry.origin.offset")
)

// System is the messaging.system of every span and metric here.
const System = "ferry"

var systemAttr = semconv.MessagingSystemKey.String(System)

// Operation names (messaging.operation.name).
const (
	opSend       = "send"
	opProcess    = "process"
	opDeadLetter = "dead_letter"
	opCommit     = "commit"
)

func partition(q int) attribute.KeyValue {
	return semconv.MessagingDestinationPartitionIDKey.String(strconv.Itoa(q))
}

// sentinels names ferry's sentinel errors for error.type.
var sentinels = []struct {
	err  error
	name string
}{
	{ferry.ErrClosed, "ferry.ErrClosed"},
	{ferry.ErrTopicNotFound, "ferry.ErrTopicNotFound"},
	{ferry.ErrTopicExists, "ferry.ErrTopicExists"},
	{ferry.ErrInvalidTopic, "ferry.ErrInvalidTopic"},
	{ferry.ErrInvalidMessage, "ferry.ErrInvalidMessage"},
	{ferry.ErrMessageTooLarge, "ferry.ErrMessageTooLarge"},
	{ferry.ErrOffsetOutOfRange, "ferry.ErrOffsetOutOfRange"},
	{ferry.ErrQueueFull, "ferry.ErrQueueFull"},
	{ferry.ErrCorrupt, "ferry.ErrCorrupt"},
	{ferry.ErrInvalidOption, "ferry.ErrInvalidOption"},
	{ferry.ErrInvalidRoute, "ferry.ErrInvalidRoute"},
	{ferry.ErrInvalidAllocation, "ferry.ErrInvalidAllocation"},
	{ferry.ErrGroupActive, "ferry.ErrGroupActive"},
	{ferry.ErrSessionExpired, "ferry.ErrSessionExpired"},
	{ferry.ErrFenced, "ferry.ErrFenced"},
	{context.Canceled, "context.Canceled"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
}

// errorType returns the error.type of err: the ferry or context sentinel
// it wraps, else its type as the semantic conventions name it.
func errorType(err error) attribute.KeyValue {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return semconv.ErrorTypeKey.String(s.name)
		}
	}
	return semconv.ErrorType(err)
}

// keyTag appends m's key and tag attributes, those that are set.
func keyTag(attrs []attribute.KeyValue, m *ferry.Message) []attribute.KeyValue {
	if m.Key != "" {
		attrs = append(attrs, KeyKey.String(m.Key))
	}
	if m.Tag != "" {
		attrs = append(attrs, TagKey.String(m.Tag))
	}
	return attrs
}
