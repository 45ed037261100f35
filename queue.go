package ferry

import (
	"context"
	"io"
)

// WritableQueue is the write side of a queue.
//
// Implementations must be safe for concurrent use. A nil ctx is
// [ErrInvalidOption].
type WritableQueue interface {
	// ID returns the queue's identity.
	ID() QueueID
	// Write appends msgs in order, sets Queue, Offset and StoreUnixNano on each
	// and returns the offset of the first. It is all or nothing: on error
	// no message of msgs is stored. An empty msgs writes nothing and returns
	// the next offset. A nil element is [ErrInvalidMessage]. A batch larger
	// than the queue's retention is [ErrMessageTooLarge]. A queue with
	// [Block] overflow blocks until there is room or ctx is done. After
	// Close it returns [ErrClosed]. The queue keeps the pointers; the caller
	// must not modify the messages afterwards.
	Write(ctx context.Context, msgs []*EnhancedMessage) (int64, error)
}

// ReadableQueue is the read side of a queue.
//
// Implementations must be safe for concurrent use by any number of readers.
// A nil ctx is [ErrInvalidOption].
type ReadableQueue interface {
	// ID returns the queue's identity.
	ID() QueueID
	// Read fills dst with messages from offset on and returns how many. It
	// blocks until at least one is there, ctx is done (returning ctx's
	// error) or the queue is closed ([ErrClosed]). An empty dst returns 0
	// at once. offset below the oldest retained offset or above the next
	// offset is [ErrOffsetOutOfRange]. The messages are shared with every
	// other reader and must not be modified.
	Read(ctx context.Context, offset int64, dst []*EnhancedMessage) (int, error)
	// Offsets returns the oldest retained offset and the next offset to be
	// written; oldest == next when the queue holds nothing.
	Offsets() (oldest, next int64)
}

// OffsetsContexter is an optional interface of a [ReadableQueue] whose
// offsets live across a network (a distributed storage, natsstore's):
// OffsetsContext is Offsets bounded by ctx, with the error Offsets cannot
// return. A ctx already done is its error, a nil ctx [ErrInvalidOption];
// after Close it is [ErrClosed]. The consumer's take and reset,
// [Broker.Lag], [Broker.Groups], [Broker.ResetGroup] and Seek use it
// where a queue has it.
type OffsetsContexter interface {
	OffsetsContext(ctx context.Context) (oldest, next int64, err error)
}

// queueOffsets returns q's offsets, through OffsetsContext where q has it.
func queueOffsets(ctx context.Context, q ReadableQueue) (oldest, next int64, err error) {
	if oc, ok := q.(OffsetsContexter); ok {
		return oc.OffsetsContext(ctx)
	}
	oldest, next = q.Offsets()
	return oldest, next, nil
}

// readParker is implemented by queues on which a consumer's fetch loop
// can wait for the next write with no goroutine of its own (the memory
// queue): 10,000 idle consumers then park 10,000 small structs, not
// 10,000 goroutines blocked in Read.
type readParker interface {
	// park lists w, to be woken by the next write (or Close), when
	// offset is the queue's next offset, and reports true; otherwise
	// (offset readable, out of range, or the queue closed) it lists
	// nothing and reports false: Read at offset does not block.
	park(offset int64, w *readWaiter) bool
	// unpark unlists w.
	unpark(w *readWaiter)
}

// readWaiter is a fetch loop parked on a queue: its kicker's kick is
// called once per park, with the queue's lock held, so it must neither
// block nor call the queue.
type readWaiter struct {
	kicker interface{ kick() } // an interface, not a func: no method value to allocate
	listed bool                // guarded by the queue's lock
}

// Queue is one partition of a topic: an append-only log with contiguous
// offsets from 0. Close is idempotent; every other method returns
// [ErrClosed] after it (Offsets returns what it last knew).
type Queue interface {
	WritableQueue
	ReadableQueue
	io.Closer
}

// TryWriter is implemented by queues that can refuse a write instead of
// blocking for room. TryWrite is Write without waiting: where Write would
// block for room it returns [ErrQueueFull] and writes nothing.
type TryWriter interface {
	TryWrite(msgs []*EnhancedMessage) (int64, error)
}

// AsyncWriter is implemented by queues that can have several writes in
// flight, such as a network store pipelining its publishes;
// [Producer.SendAsync] uses it (except on [Block] topics, whose writes
// wait for room). WriteAsync begins a write of msgs, as Write would make
// it, and returns without waiting for its outcome; writes begun one after
// another are stored in that order. done is called exactly once per
// write, with what Write would have returned, in the order the writes
// were begun (a refused write too: bad input, a nil ctx, a closed
// queue), on a goroutine of the queue's or, for a write refused at once,
// possibly before WriteAsync returns. A write cut off by ctx, or failing
// while in flight, may have been stored (as for Write, the outcome may be
// unknown); writes begun after it go on and report their own outcome.
// WriteAsync may block while the queue has many writes in flight. done
// must not call WriteAsync or Close of the same queue, and should be
// quick: it holds up the reports of later writes. Close reports every
// write in flight (its outcome, or [ErrClosed] if the queue stops
// waiting for it) and returns after every done has returned. The
// messages are the queue's until done is called.
type AsyncWriter interface {
	WriteAsync(ctx context.Context, msgs []*EnhancedMessage, done func(first int64, err error))
}

// Releaser is implemented by queues with [Block] overflow. Release tells the
// queue that every consumer is done with the messages below offset, so
// retention may drop them to make room. Offsets only move forward; a lower
// offset than before is ignored.
type Releaser interface {
	Release(offset int64)
}

// Storage opens queues and keeps topic metadata.
//
// Implementations must be safe for concurrent use. After Close every method
// returns [ErrClosed]. A nil ctx is [ErrInvalidOption].
type Storage interface {
	// OpenQueue opens queue number queue (in [0, meta.Queues)) of the topic
	// meta describes, creating it empty if needed. Invalid metadata or
	// index is [ErrInvalidTopic]. The caller closes the queue.
	OpenQueue(ctx context.Context, meta TopicMeta, queue int) (Queue, error)
	// Topics returns the metadata saved so far, sorted by name.
	Topics(ctx context.Context) ([]TopicMeta, error)
	// SaveTopic records meta (replacing an earlier value for the same
	// name). Invalid metadata is [ErrInvalidTopic].
	SaveTopic(ctx context.Context, meta TopicMeta) error
	io.Closer
}

// TopicDeleter is an optional interface of a [Storage] that deletes
// topics (see [Broker.DeleteTopic]): DeleteTopic closes the topic's open
// queues, forgets its metadata and frees what its messages took (memory,
// files). Deleting a topic the storage does not hold does nothing; an
// invalid name is [ErrInvalidTopic], a nil ctx [ErrInvalidOption].
type TopicDeleter interface {
	DeleteTopic(ctx context.Context, name string) error
}

// SharedStorage is an optional interface of a [Storage] that several
// brokers share, in one process or in many: it creates a topic only if it
// is absent, and looks one up by name, so that a topic one broker creates
// is found by the others. [Broker.CreateTopic] and a broker's lookup of a
// topic it does not know use it when the storage has it; over another
// storage, CreateTopic compares with Topics and then saves, which two
// brokers may race, and a lookup lists every topic. A nil ctx is
// [ErrInvalidOption].
type SharedStorage interface {
	// CreateTopic records meta unless the storage holds a topic of that
	// name: with equal metadata (after [TopicMeta.Normalized]) it does
	// nothing and returns nil, with different metadata it is
	// [ErrTopicExists]. Invalid metadata is [ErrInvalidTopic].
	CreateTopic(ctx context.Context, meta TopicMeta) error
	// Topic returns the metadata of the named topic; [ErrTopicNotFound]
	// if there is none.
	Topic(ctx context.Context, name string) (TopicMeta, error)
}
