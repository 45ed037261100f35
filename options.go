package ferry

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// StartFrom says where a group with no committed cursor starts reading.
type StartFrom int

const (
	// Earliest starts at the oldest retained message (the default).
	Earliest StartFrom = iota
	// Latest starts at the next message written after the consumer takes
	// the queue.
	Latest
)

// String returns the name of the start position.
func (s StartFrom) String() string {
	switch s {
	case Earliest:
		return "Earliest"
	case Latest:
		return "Latest"
	default:
		return "StartFrom(" + strconv.Itoa(int(s)) + ")"
	}
}

// Consumer defaults.
const (
	DefaultConcurrency  = 20 // RocketMQ's consumer goroutines
	DefaultMaxAttempts  = 5
	DefaultRetryBackoff = 100 * time.Millisecond
	DefaultDrainTimeout = 10 * time.Second
	// DefaultMaxRetryBackoff caps the growing wait between attempts by
	// default (see WithMaxRetryBackoff).
	DefaultMaxRetryBackoff = 30 * time.Second
)

// ConsumerOption configures a push [Consumer] ([Broker.NewConsumer]).
// The options of push consumers only (those of handling: [Ordered],
// [WithConcurrency], [WithRetry], [WithMaxRetryBackoff],
// [WithDeadLetter]) are ConsumerOptions; a [GroupOption] is one too.
type ConsumerOption interface {
	applyConsumer(*consumerConfig)
}

// PullConsumerOption configures a [PullConsumer]
// ([Broker.NewPullConsumer]). [WithAutoCommit] is one, for pull consumers
// only; a [GroupOption] is one too. So a push-only option given to a pull
// consumer, or WithAutoCommit to a push one, does not compile.
type PullConsumerOption interface {
	applyPull(*consumerConfig)
}

// GroupOption configures either kind of consumer: membership, allocation,
// buffers, where to start, callbacks. It is both a [ConsumerOption] and a
// [PullConsumerOption].
type GroupOption interface {
	ConsumerOption
	PullConsumerOption
}

// pushOption is a ConsumerOption for push consumers only.
type pushOption func(*consumerConfig)

func (o pushOption) applyConsumer(c *consumerConfig) {
	if o != nil {
		o(c)
	}
}

// pullOption is a PullConsumerOption for pull consumers only.
type pullOption func(*consumerConfig)

func (o pullOption) applyPull(c *consumerConfig) {
	if o != nil {
		o(c)
	}
}

// groupOption is a GroupOption.
type groupOption func(*consumerConfig)

func (o groupOption) applyConsumer(c *consumerConfig) {
	if o != nil {
		o(c)
	}
}

func (o groupOption) applyPull(c *consumerConfig) {
	if o != nil {
		o(c)
	}
}

type consumerConfig struct {
	allocator    Allocator
	broadcast    bool
	memberID     string
	generatedID  bool // memberID was made up: it never comes back after Close
	concurrency  int
	ordered      bool
	orderedByKey bool // see OrderedByKey
	buffer       BufferConfig
	startFrom    StartFrom
	tags         []string
	maxAttempts  int
	backoff      time.Duration
	maxBackoff   time.Duration
	deadLetter   string
	drainTimeout time.Duration
	// handlerTimeout limits each handler call (see WithHandlerTimeout).
	handlerTimeout time.Duration
	// rate and burst limit the handler calls (see WithRateLimit) when
	// limited.
	rate       float64
	burst      int
	limited    bool
	onError    func(error)
	onReset    func(q QueueID, from, to int64)
	onAssigned func(QueueID)
	onRevoked  func(QueueID)
	hooks      []Hook
	autoCommit bool
	retryTopic string // where failures are retried off the queue
	retryOf    string // for a consumer of a retry topic: the origin topic
	// transactional: handler calls are transactions (see Transactional),
	// their records kept in the topic txnLog.
	transactional bool
	txnLog        string
}

// WithAllocator sets how the group's queues are split among its members.
// Default: [AllocateAveragely]. Ignored with [Broadcast]. For push and
// pull consumers.
func WithAllocator(a Allocator) GroupOption {
	return groupOption(func(c *consumerConfig) { c.allocator = a })
}

// Broadcast makes every member of the group get every queue, with a cursor
// of its own kept under the group key "<group>@<member ID>" (see
// [WithMemberID]). Default: clustering, each queue owned by exactly one
// member. For push and pull consumers.
func Broadcast() GroupOption { return groupOption(func(c *consumerConfig) { c.broadcast = true }) }

// WithMemberID sets the member's ID in its group: 1 to 128 bytes without
// '@', unique among the group's live members. Set a stable one for
// [Broadcast], whose cursors are kept per member ID (under
// "<group>@<member>"), so they survive restarts. Default:
// "<host>-<pid>-<n>", n counting the consumers of the process. For push
// and pull consumers.
func WithMemberID(id string) GroupOption {
	return groupOption(func(c *consumerConfig) { c.memberID = id })
}

// WithConcurrency sets the most goroutines that run the handler at once
// (push consumers only). They start when there is work for them and retire after a
// second without any, so an idle consumer keeps none; the first is often
// the goroutine that fetched the messages (see [Consumer]). Default:
// [DefaultConcurrency]. With [Ordered] a queue is still handled by
// one goroutine at a time. The goroutines share a queue's messages as far
// as it pays: the consumer times the handler, and a goroutine handles
// alone as many messages (up to 16) as the handler gets through in about
// 50µs, calling another only for more than that, so a fast handler is not
// spread over goroutines that cost more to wake than the work they get.
func WithConcurrency(n int) ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.concurrency = n })
}

// Ordered handles each queue one message at a time in offset order, the
// queue's [Buffer] lock held while handling (push consumers only); a
// failing message holds its queue until it succeeds or goes to the
// dead-letter topic. Default: concurrent.
func Ordered() ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.ordered = true })
}

// OrderedByKey handles each key's messages one at a time in offset order,
// and different keys in parallel, up to [WithConcurrency] at once (push
// consumers only): per queue, a message reaches a handler only once every
// lower-offset message of its key finished (succeeded or went to the
// dead-letter topic), on this member or, after a hand-over or a restart,
// the next owner (the cursor stays at the queue's smallest unfinished
// offset). A failing message holds only its key: it is retried in place,
// after its backoff, and the key's later messages wait for it, while the
// other keys flow on. Messages with an empty key are ordered with none.
// A key's waiting messages count in the queue's [Buffer]: a slow key can
// fill it (see [WithBuffer], [WithMaxSpan]). It cannot be combined with
// [Ordered]. Per message, the cost is a map lookup; the memory, one entry
// per key with a message in flight.
func OrderedByKey() ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.orderedByKey = true })
}

// WithBuffer sets the capacity of each queue's [Buffer] in messages and
// bytes of [Message.Size]. Default: [DefaultBufferMessages] and
// [DefaultBufferBytes]. For push and pull consumers.
func WithBuffer(maxMessages int, maxBytes int64) GroupOption {
	return groupOption(func(c *consumerConfig) { c.buffer.MaxMessages, c.buffer.MaxBytes = maxMessages, maxBytes })
}

// WithWatermarks sets, as fractions of the buffer capacity, where fetching
// pauses (high, in (0, 1]) and resumes (low, in [0, high)). Default:
// [DefaultHighWatermark] and [DefaultLowWatermark]. For push and pull
// consumers.
func WithWatermarks(high, low float64) GroupOption {
	return groupOption(func(c *consumerConfig) { c.buffer.HighWatermark, c.buffer.LowWatermark = high, low })
}

// WithMaxSpan bounds the distance between a queue's oldest unfinished
// offset and its newest fetched one; fetching pauses beyond it. Default:
// [DefaultMaxSpan]. For push and pull consumers.
func WithMaxSpan(n int64) GroupOption {
	return groupOption(func(c *consumerConfig) { c.buffer.MaxSpan = n })
}

// WithStartFrom sets where a group with no committed cursor for a queue
// starts. Default: [Earliest], so a group started after the first sends
// still sees them (within retention). For push and pull consumers.
func WithStartFrom(s StartFrom) GroupOption {
	return groupOption(func(c *consumerConfig) { c.startFrom = s })
}

// WithTags delivers only messages whose Tag is one of tags; the others are
// skipped and still committed. Default: every message. For push and pull
// consumers.
func WithTags(tags ...string) GroupOption {
	return groupOption(func(c *consumerConfig) { c.tags = append(c.tags, tags...) })
}

// WithRetry sets how many times a message is attempted in all (at least
// 1) and the wait before the first retry, which doubles on each later one
// up to [DefaultMaxRetryBackoff] (see [WithMaxRetryBackoff]) (push
// consumers only: a pull consumer has no retries). In concurrent mode the
// retry waits in the group's retry topic (see [RetryTopic]); with
// [Ordered] or [Broadcast] it waits in its queue. Default:
// [DefaultMaxAttempts] and [DefaultRetryBackoff].
func WithRetry(maxAttempts int, backoff time.Duration) ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.maxAttempts, c.backoff = maxAttempts, backoff })
}

// WithMaxRetryBackoff caps the wait between attempts, which doubles from
// the [WithRetry] backoff on each retry; a cap equal to that backoff makes
// the wait constant (push consumers only). Default:
// [DefaultMaxRetryBackoff].
func WithMaxRetryBackoff(d time.Duration) ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.maxBackoff = d })
}

// WithDeadLetter sets the topic failed messages go to (push consumers
// only); Start
// creates it with one queue if it does not exist, so that a reader of
// dead letters can start with the consumer. A dead letter
// is the message with the headers of its origin added (the error text cut
// to 1 KiB), sent with no size bound of its own, so whatever a producer
// could send can be dead-lettered; a send the topic's queue refuses is
// tried again with backoff and reported (see [WithOnError]), the message
// staying unfinished. Default: [DeadLetterTopic] of the group
// ("%DLQ%<group>"), a system topic, whose retention never drops a dead
// letter; a topic named here is the user's, made with the default
// retention. A system topic's name other than a dead-letter topic's is
// [ErrInvalidOption].
func WithDeadLetter(topic string) ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.deadLetter = topic })
}

// WithDrainTimeout bounds how long releasing a queue (on rebalance or
// Close) waits for its in-flight messages to finish before it commits what
// finished, cancels the handlers' context and lets the queue go; the
// unfinished ones are delivered again to the next owner, and no handling
// of the queue's messages starts on this member after that. Zero does not
// wait. Default: [DefaultDrainTimeout]. For push and pull consumers (a
// pull consumer's in-flight messages are those polled and not committed).
func WithDrainTimeout(d time.Duration) GroupOption {
	return groupOption(func(c *consumerConfig) { c.drainTimeout = d })
}

// WithOnError sets a function called with errors that happen in the
// background: an allocator split that breaks the rules
// ([ErrInvalidAllocation], naming the allocator), failed commits, failed
// dead-letter sends, read errors. It is called from the consumer's
// goroutines and must not block. The broker's logger logs them too.
// Default: none. For push and pull consumers.
func WithOnError(f func(error)) GroupOption {
	return groupOption(func(c *consumerConfig) { c.onError = f })
}

// WithOnReset sets a function called when a queue's cursor is reset
// because it fell out of the retained range (behind retention, or past
// the end): from is where the consumer was, to where it goes on. The
// broker's logger logs it at Warn too. It must not block. Default: none.
// For push and pull consumers.
func WithOnReset(f func(q QueueID, from, to int64)) GroupOption {
	return groupOption(func(c *consumerConfig) { c.onReset = f })
}

// WithOnAssigned sets a function called when the consumer has taken a
// queue (locked it and loaded its cursor), before it fetches from it:
// open a connection for it, say. It is called once per queue taken, from
// that queue's goroutine, so for different queues at once; a panic in it
// is reported (see [WithOnError]). Default: none. For push and pull
// consumers.
func WithOnAssigned(f func(QueueID)) GroupOption {
	return groupOption(func(c *consumerConfig) { c.onAssigned = f })
}

// WithOnRevoked sets a function called when the consumer gives a queue up
// (a rebalance, Close), after its in-flight messages finished (or the
// drain timed out) and its cursor was committed, and before it unlocks
// the queue for the next owner: release what [WithOnAssigned] opened. It
// is called too when the queue's lease was lost (no drain and no commit
// then: the next owner may have it already). Called once per queue, from
// the goroutine releasing it, so for different queues at once; a panic
// in it is reported. Default: none. For push and pull consumers.
func WithOnRevoked(f func(QueueID)) GroupOption {
	return groupOption(func(c *consumerConfig) { c.onRevoked = f })
}

// WithAutoCommit makes a [PullConsumer] mark the messages of a Poll
// finished at the next Poll or Close, and those of
// [PullConsumer.Messages] once the loop body is done with each (pull
// consumers only). Default: off; call [PullConsumer.Commit].
func WithAutoCommit() PullConsumerOption {
	return pullOption(func(c *consumerConfig) { c.autoCommit = true })
}

var memberSeq atomic.Int64

// newConsumerConfig applies the options (apply calls each) over the
// defaults and validates the result; errors wrap ErrInvalidOption.
func newConsumerConfig(group, topic string, apply func(*consumerConfig)) (*consumerConfig, error) {
	c := &consumerConfig{
		allocator:    AllocateAveragely(),
		concurrency:  DefaultConcurrency,
		maxAttempts:  DefaultMaxAttempts,
		backoff:      DefaultRetryBackoff,
		maxBackoff:   DefaultMaxRetryBackoff,
		drainTimeout: DefaultDrainTimeout,
		buffer:       BufferConfig{}.withDefaults(),
	}
	apply(c)
	if c.memberID == "" {
		c.generatedID = true
		c.memberID = bornAddress + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(memberSeq.Add(1), 10)
	}
	if err := ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return nil, err
	}
	if IsSystemTopic(c.deadLetter) && !isDeadLetterTopic(c.deadLetter) {
		return nil, fmt.Errorf("%w: dead-letter topic %q: a system topic's name (see IsSystemTopic)", ErrInvalidOption, c.deadLetter)
	}
	switch {
	case c.allocator == nil:
		return nil, fmt.Errorf("%w: nil allocator", ErrInvalidOption)
	case strings.Contains(group, "@") || strings.Contains(c.memberID, "@"):
		// Broadcast cursors live under "<group>@<member>": with '@' barred
		// from both, no two consumers can share a cursor by accident.
		return nil, fmt.Errorf("%w: group %q or member id %q contains '@'", ErrInvalidOption, group, c.memberID)
	case len(c.memberID) > 128:
		return nil, fmt.Errorf("%w: member id of %d bytes", ErrInvalidOption, len(c.memberID))
	case c.broadcast && len(group)+1+len(c.memberID) > 255:
		return nil, fmt.Errorf("%w: group and member id too long for a broadcast cursor", ErrInvalidOption)
	case c.ordered && c.orderedByKey:
		return nil, fmt.Errorf("%w: Ordered and OrderedByKey together", ErrInvalidOption)
	case c.transactional && c.broadcast:
		return nil, fmt.Errorf("%w: Transactional and Broadcast together", ErrInvalidOption)
	case c.concurrency < 1:
		return nil, fmt.Errorf("%w: concurrency %d", ErrInvalidOption, c.concurrency)
	case c.startFrom != Earliest && c.startFrom != Latest:
		return nil, fmt.Errorf("%w: %v", ErrInvalidOption, c.startFrom)
	case c.maxAttempts < 1:
		return nil, fmt.Errorf("%w: max attempts %d", ErrInvalidOption, c.maxAttempts)
	case c.backoff < 0:
		return nil, fmt.Errorf("%w: retry backoff %v", ErrInvalidOption, c.backoff)
	case c.maxBackoff < 0:
		return nil, fmt.Errorf("%w: max retry backoff %v", ErrInvalidOption, c.maxBackoff)
	case c.drainTimeout < 0:
		return nil, fmt.Errorf("%w: drain timeout %v", ErrInvalidOption, c.drainTimeout)
	case c.handlerTimeout < 0:
		return nil, fmt.Errorf("%w: handler timeout %v", ErrInvalidOption, c.handlerTimeout)
	case c.limited && !validRate(c.rate, c.burst):
		return nil, fmt.Errorf("%w: rate limit %v per second, burst %d", ErrInvalidOption, c.rate, c.burst)
	}
	for _, t := range c.tags {
		if t == "" {
			return nil, fmt.Errorf("%w: empty tag", ErrInvalidOption)
		}
	}
	if err := c.buffer.validate(); err != nil {
		return nil, err
	}
	return c, nil
}
