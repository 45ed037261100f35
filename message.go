package ferry

import (
	"cmp"
	"fmt"
	"strconv"
	"time"
)

// Message is what a user sends: a topic, an optional routing key and tag,
// headers and a body.
//
// The caller must not modify a Message, its Headers or its Body after
// passing it to Send: the stored message shares them.
type Message struct {
	// Topic names the topic the message goes to. Required.
	Topic string
	// Key routes the message: with the default router, messages with the
	// same non-empty Key land on the same queue, hence keep their order.
	Key string
	// Tag is a short label consumers can filter on (see WithTags).
	Tag string
	// Headers carry user metadata.
	Headers map[string]string
	// Body is the payload.
	Body []byte
	// DedupKey, when not empty, makes the write idempotent: a message
	// whose DedupKey was already stored in the same queue within its
	// topic's [TopicMeta.DedupWindow] is not stored again, and Send
	// reports where the first one went (its ID, Queue and Offset, with
	// [SendResult].Duplicate set). A Send retried after a timeout or an
	// error with the same key is so stored at most once within the window
	// (the idempotent producer of Kafka, JetStream's Nats-Msg-Id). Keys
	// are compared per queue: route messages with the same DedupKey to
	// the same queue (the default router does, given the same Key). Up
	// to [MaxDedupKeyLen] bytes, not starting with "%" (the library's
	// own keys do); stored with the message. A delayed message's key is
	// checked where it waits, against the delayed sends of the key to
	// its topic within the window (a retried delayed Send is a
	// duplicate), and again when it is delivered, against what its topic
	// stored within its window. Empty: no deduplication.
	DedupKey string
	// DeliverAt, when after the broker's clock reads now (see
	// [WithClock]), delays the message: consumers get it no earlier than
	// this time, and shortly after. Meanwhile it waits in an internal
	// topic (see [IsDelayTopic]), durable like any other on a persistent
	// storage. Zero or past: now. Not stored: a delivered message carries
	// its due time in the [HeaderDeliverAt] header.
	DeliverAt time.Time
}

// Size returns the bytes a message counts for in size limits, retention and
// flow control: its body, key, tag, dedup key and header keys and values.
func (m *Message) Size() int {
	n := len(m.Body) + len(m.Key) + len(m.Tag) + len(m.DedupKey)
	if len(m.Headers) == 0 {
		return n // skips starting a map iteration: Size runs twice per Send
	}
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// MaxTopicNameLen is the longest valid topic name, in bytes (Kafka's limit).
const MaxTopicNameLen = 249

// ValidateTopicName reports whether name is a valid topic name: 1 to
// [MaxTopicNameLen] bytes of [A-Za-z0-9._%-], and neither "." nor "..".
// Names become directory names in filestore, so nothing else is allowed.
// The error wraps [ErrInvalidTopic].
func ValidateTopicName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidTopic)
	}
	if len(name) > MaxTopicNameLen {
		return fmt.Errorf("%w: name of %d bytes exceeds %d", ErrInvalidTopic, len(name), MaxTopicNameLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%w: name %q", ErrInvalidTopic, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '.', c == '_', c == '-', c == '%':
		default:
			return fmt.Errorf("%w: name %q has byte %q at %d", ErrInvalidTopic, name, c, i)
		}
	}
	return nil
}

// QueueID names one queue (partition) of a topic. QueueIDs sort by topic,
// then by queue (see [QueueID.Compare]).
type QueueID struct {
	Topic string
	Queue int
}

// Compare returns -1, 0 or +1 as q sorts before, equal to or after o.
func (q QueueID) Compare(o QueueID) int {
	if c := cmp.Compare(q.Topic, o.Topic); c != 0 {
		return c
	}
	return cmp.Compare(q.Queue, o.Queue)
}

// String returns "topic[queue]".
func (q QueueID) String() string {
	return q.Topic + "[" + strconv.Itoa(q.Queue) + "]"
}

// Overflow says what a queue does when a write would exceed its retention.
type Overflow int

const (
	// DropOldest (the default) deletes the oldest messages to make room.
	// A consumer whose cursor falls behind resets to the oldest retained
	// offset and reports it.
	DropOldest Overflow = iota
	// Block keeps every message not yet released (see [Releaser]): Send
	// blocks until consumers free room, TrySend returns [ErrQueueFull].
	Block
)

// String returns the name of the overflow policy.
func (o Overflow) String() string {
	switch o {
	case DropOldest:
		return "DropOldest"
	case Block:
		return "Block"
	default:
		return "Overflow(" + strconv.Itoa(int(o)) + ")"
	}
}

// Unlimited, as a Retention bound, switches that bound off.
const Unlimited = -1

// Default retention bounds per queue, applied to zero fields of Retention.
const (
	DefaultRetentionMessages = 1 << 20   // 1,048,576 messages
	DefaultRetentionBytes    = 256 << 20 // 256 MiB of Message.Size
)

// Retention bounds each queue of a topic. A zero field takes its default
// ([DefaultRetentionMessages], [DefaultRetentionBytes], no age bound), so
// memory is bounded unless a field is set to [Unlimited].
type Retention struct {
	// MaxMessages bounds the messages retained per queue.
	MaxMessages int64
	// MaxBytes bounds the sum of Message.Size retained per queue.
	MaxBytes int64
	// MaxAge bounds the age (by StoreTime) of retained messages; zero or
	// negative means no age bound.
	MaxAge time.Duration
	// Overflow chooses between dropping the oldest messages (default) and
	// back-pressure.
	Overflow Overflow
}

// TopicMeta is a topic's metadata.
type TopicMeta struct {
	// Name is the topic name; see [ValidateTopicName].
	Name string
	// Queues is the number of queues (partitions), at least 1.
	Queues int
	// Retention bounds each queue.
	Retention Retention
	// DedupWindow is how long each queue remembers the [Message.DedupKey]
	// of the messages stored in it: a write carrying a key stored less
	// than DedupWindow before is not stored again. Zero takes
	// [DefaultDedupWindow]; [DedupOff] switches deduplication off (keys
	// are stored, not acted on); otherwise it must be in (0,
	// [MaxDedupWindow]]. A queue holds one entry per key stored within
	// the window, whatever its retention: memory grows with the rate of
	// keyed messages times the window.
	DedupWindow time.Duration
	// Incarnation tells this topic from an earlier one of the same name,
	// deleted since: [Broker.CreateTopic] gives every topic it creates a
	// new one (a value passed to it is ignored), the storage keeps it, and
	// a broker sharing the storage that finds another incarnation than
	// the one it has open knows that topic was deleted and created again
	// (its producers move to the new topic; a delayed message or a retry
	// bound for the old one is dropped, not delivered to the new). Zero
	// for a topic saved before incarnations existed. It is not part of
	// the topic's settings: see [TopicMeta.Matches].
	Incarnation uint64
}

// Deduplication windows (see [TopicMeta.DedupWindow]).
const (
	// DefaultDedupWindow is the window of a topic whose DedupWindow is
	// zero: two minutes, JetStream's default duplicates window.
	DefaultDedupWindow = 2 * time.Minute
	// MaxDedupWindow is the longest window a topic may have (seven days,
	// Kafka's producer-state expiry).
	MaxDedupWindow = 7 * 24 * time.Hour
	// DedupOff, as a DedupWindow, switches deduplication off.
	DedupOff time.Duration = -1
)

// MaxDedupKeyLen is the longest [Message.DedupKey], in bytes.
const MaxDedupKeyLen = 1024

// MaxQueues is the largest queue count a topic may have.
const MaxQueues = 1 << 16

// Validate reports whether meta is usable; the error wraps
// [ErrInvalidTopic] (for a bad DedupWindow, [ErrInvalidOption] too).
func (meta TopicMeta) Validate() error {
	if err := ValidateTopicName(meta.Name); err != nil {
		return err
	}
	if meta.Queues < 1 || meta.Queues > MaxQueues {
		return fmt.Errorf("%w: topic %q: queue count %d not in [1, %d]", ErrInvalidTopic, meta.Name, meta.Queues, MaxQueues)
	}
	r := meta.Retention
	if r.MaxMessages < Unlimited || r.MaxBytes < Unlimited {
		return fmt.Errorf("%w: topic %q: negative retention bound", ErrInvalidTopic, meta.Name)
	}
	if r.Overflow != DropOldest && r.Overflow != Block {
		return fmt.Errorf("%w: topic %q: unknown overflow policy %d", ErrInvalidTopic, meta.Name, r.Overflow)
	}
	if w := meta.DedupWindow; w != DedupOff && (w < 0 || w > MaxDedupWindow) {
		return fmt.Errorf("%w: topic %q: dedup window %v not DedupOff nor in [0, %v]: %w", ErrInvalidTopic, meta.Name, w, MaxDedupWindow, ErrInvalidOption)
	}
	return nil
}

// Normalized returns meta with the defaults of zero retention fields and
// of a zero DedupWindow filled in. Two metadata values describe the same
// topic settings when they match (see [TopicMeta.Matches]).
func (meta TopicMeta) Normalized() TopicMeta {
	if meta.Retention.MaxMessages == 0 {
		meta.Retention.MaxMessages = DefaultRetentionMessages
	}
	if meta.Retention.MaxBytes == 0 {
		meta.Retention.MaxBytes = DefaultRetentionBytes
	}
	if meta.Retention.MaxAge < 0 {
		meta.Retention.MaxAge = 0
	}
	if meta.DedupWindow == 0 {
		meta.DedupWindow = DefaultDedupWindow
	}
	return meta
}

// Matches reports whether meta and other describe the same topic
// settings: equal once normalized, whatever their incarnations. Creating
// a topic that exists is idempotent when the metadata match.
func (meta TopicMeta) Matches(other TopicMeta) bool {
	a, b := meta.Normalized(), other.Normalized()
	a.Incarnation, b.Incarnation = 0, 0
	return a == b
}
