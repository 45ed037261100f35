// Package ferry is an embeddable, in-process messaging library: topics split
// into queues (partitions), producers with pluggable routing, consumer
// groups in which each queue has exactly one owner, flow-controlled consumer
// buffers, persisted consumer cursors, retries and dead letters. It keeps
// everything in memory by default; package filestore keeps it on disk.
//
// # Sending
//
// A [Broker] owns topics. [Broker.CreateTopic] makes a topic of n queues;
// [Broker.NewProducer] returns a [Producer] whose [Producer.Send] stamps a
// [Message] into an [EnhancedMessage] (ID, born time, [Origin]), asks its
// [Router] for a queue and writes it there:
//
//	b, _ := ferry.NewBroker()
//	defer b.Close()
//	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 4})
//	p, _ := b.NewProducer()
//	res, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "customer-42", Body: body})
//
// The default router, [KeyHashRouter], sends equal keys to the same queue,
// exactly as Kafka's default partitioner does.
//
// Send returns once the message is stored. [Producer.SendAsync] returns
// as soon as the message is checked and routed, and calls back with the
// result later, so one goroutine keeps many sends in flight: on filestore
// they share fdatasyncs, on natsstore each queue's pending sends go as one
// batch per round trip. Per queue, sends are written and reported in the
// order they were made; at most [WithMaxInFlight] are outstanding (then
// SendAsync waits); [Producer.Flush] waits for every report, and
// [Producer.Close] flushes before it returns:
//
//	err := p.SendAsync(ctx, &ferry.Message{Topic: "orders", Body: body}, func(res ferry.SendResult, err error) {
//		// runs once: stored at res.Queue, res.Offset, or not stored (err)
//	})
//	err = p.Flush(ctx)
//
// A message with a [Message].DedupKey is stored at most once per queue
// within its topic's [TopicMeta].DedupWindow (default
// [DefaultDedupWindow], two minutes; [DedupOff] switches it off): a Send
// retried after a timeout with the same key reports where the first one
// went, with [SendResult].Duplicate set, instead of storing it again
// (Kafka's idempotent producer, JetStream's Nats-Msg-Id). filestore
// keeps the window across restarts and crashes.
//
// # Consuming
//
// [Broker.NewConsumer] returns a push [Consumer] that calls a [Handler] for
// each message, at least once; [Broker.NewPullConsumer] returns a
// [PullConsumer] to Poll and Commit instead. Both are members of a
// consumer group: on Start a member joins, every membership change
// recomputes every member's share with the group's [Allocator], and a
// member releases the queues it loses (stops fetching, lets in-flight
// messages finish up to [WithDrainTimeout], commits, unlocks) before
// another takes them; a lock per (group, queue) keeps one owner even under
// a broken allocator, which is reported with [ErrInvalidAllocation].
// [Broadcast] gives every member every queue instead, with cursors kept
// per member ID under "<group>@<member>". A push consumer takes
// [ConsumerOption]s, a pull consumer [PullConsumerOption]s; the options
// of both are [GroupOption]s, so a push-only option given to a pull
// consumer (or [WithAutoCommit] to a push one) does not compile.
//
//	c, _ := b.NewConsumer("billing", "orders", ferry.HandlerFunc(
//		func(ctx context.Context, m *ferry.EnhancedMessage) error {
//			d, _ := ferry.DeliveryFrom(ctx) // attempt number, group
//			return bill(m.Body, d.Attempt)
//		}), ferry.WithConcurrency(8))
//	_ = c.Start(ctx)
//	defer c.Close()
//
// Each owned queue has a [Buffer] between its fetch loop and the handlers:
// fetching pauses at the buffer's high watermark (or max span) and resumes
// at its low one. The committed cursor of a queue is its smallest
// unfinished offset, so a crash or rebalance delivers again every message
// of the queue from there on: the messages in flight and, in concurrent
// mode, those after the oldest unfinished one that finished already (at
// most [WithMaxSpan] of them). [Ordered] handles a queue's messages one at
// a time, and no message of a queue reaches a handler, on this member or
// the next owner, before every lower offset has finished (succeeded or
// been dead-lettered): a released queue stops handing out messages at
// once. [OrderedByKey] keeps that order per key, with keys in parallel. A failing message is retried with backoff ([WithRetry],
// [RetryAfter]), then goes with headers naming its origin to the
// dead-letter topic ([WithDeadLetter], [DeadLetterTopic] by default). In
// concurrent mode the retry does not hold the queue: the message is
// written to the group's retry topic ([RetryTopic]) due after its
// backoff, its offset finishes, and the consumer gets it from there with
// its true attempt number, across owners and restarts. [Ordered] (and
// [Broadcast]) retry in place: the queue waits. A dead-letter (or retry)
// write that fails is tried again with backoff and reported, the message
// staying unfinished until it is written.
//
// A message with a [Message.DeliverAt] in the future reaches consumers no
// earlier than that (on the broker's [Clock]) and shortly after; it
// waits in internal topics ("%DELAY%<n>", see [IsDelayTopic]), so it is as
// durable as the storage, and memory does not grow with the number
// waiting. A key's messages with ordered due times arrive in that order,
// whichever broker sent them: over a shared storage, one broker at a time
// moves every delayed message (the others wait to take over when it closes
// or dies).
// Topics whose names start with '%' are the library's ([IsSystemTopic]):
// users read and consume them, but creating, writing, growing or deleting
// one is [ErrInvalidTopic], and their retention never drops a message.
// A cursor that fell out of the retained range resets to the
// oldest retained offset and says so ([WithOnReset], and a Warn log). On a
// topic with [Block] overflow, the lowest cursor of every group with a
// committed cursor on the topic releases room for producers (over a cursor
// store with [CursorGroups], as the memory and file stores are, this
// includes groups with no member running; see [Broker.ForgetGroup]).
//
// A [Transactional] consumer's handler sends through the [Outbox] of its
// context ([OutboxFrom]): its outputs are stored if and only if the call
// succeeds, with the finishing of the message handled, exactly once
// across crashes and hand-overs, within the output topics' deduplication
// windows (see [Transactional] and [TransactionLog]).
//
// Calls that wait take a context that bounds the call only: a Start or a
// Poll that times out leaves its consumer running, to be closed with
// Close, which returns what failed while closing. A nil context is bad
// input: every call that takes one, the seams' included, returns an
// error wrapping [ErrInvalidOption] for it.
//
// # Typed messages
//
// [TypedProducer], [TypedHandler] and [TypedPullConsumer] send and handle
// values of a Go type instead of bytes, encoding them with a
// [BodyCodec]: [JSONCodec] (encoding/json) unless [WithBodyCodec] names
// another; module github.com/ferrymq/ferry/protocodec has protobuf's.
// A [TypedMessage] carries what a Message does, with a Value for the
// body; the handler gets the value and the message (key, headers, offset):
//
//	orders, _ := ferry.NewTypedProducer[Order](p)
//	_, err := orders.Send(ctx, &ferry.TypedMessage[Order]{Topic: "orders", Key: o.Customer, Value: o})
//
//	c, _ := b.NewConsumer("billing", "orders", ferry.TypedHandler(
//		func(ctx context.Context, o Order, m *ferry.EnhancedMessage) error {
//			return bill(o)
//		}))
//
// A value that does not encode is bad input ([ErrInvalidMessage]; nothing
// sent). A body that does not decode is a permanent failure: the handler
// is not called and the message goes to the dead-letter topic at once,
// the decode error in its [HeaderError]. A typed pull consumer hands such
// a message out with its error ([Received].Err), to be dealt with and
// committed by the caller. A nil value of a pointer or interface type is
// refused on both sides.
//
// # Seams
//
// Every moving part is a small interface with an in-memory default:
// [Queue] and [Storage] (where messages live), [Router] (which queue a
// message goes to), [Allocator] (which queues a group member owns) and
// [CursorStore] (where group progress persists). Package ferrytest holds
// the conformance suites every implementation runs (TestQueue,
// TestStorage, TestCursorStore, TestAllocator) and fault-injecting fakes
// for testing code that publishes or consumes; package filestore keeps
// queues and cursors on disk.
//
// # Coordination
//
// Group membership and queue locks go through a [Coordinator]
// ([WithCoordinator]; a [MemoryCoordinator] per broker by default). A
// member's [Session] tells it of membership changes and ends when it
// leaves or expires; each queue it owns is held by a [Lease] whose
// [Lease.Token] grows with every lock of that queue and whose
// [Lease.Lost] fires before anyone else can lock it. On Lost a member
// stops the queue at once, cancels its handlers and commits nothing
// more; an expired session joins again. Commits carry the token where
// the cursor store is a [FencedCursorStore], which refuses a stale one
// with [ErrFenced] (treated as Lost); a lease with a deadline
// ([DeadlineLease]) is treated as lost once the deadline passes by the
// member's clock. After a revoke no handling starts: the unstarted rest
// of a taken batch goes back unfinished, and over a [HandoffCursorStore]
// the messages finished above it travel with the last commit (its
// finished set), which the next owner skips. Brokers sharing a Storage, a
// CursorStore and a Coordinator behave as one: members in any of them
// split a group's queues, topics created through one are found by the
// others ([SharedStorage]), and [Block] release counts every group with
// a cursor in the store ([CursorGroups]).
//
// # Building blocks for other brokers
//
// Some exported names are parts for a broker of your own, usable without
// a [Broker] and public by design (an API cleanup that finds no caller of
// them in Ferry itself must keep them):
//
//   - messages: [EnhancedMessage], [Message], [MessageID] ([NewMessageID]),
//     [Origin], [QueueID], [TopicMeta] and [Retention]; package codec
//     encodes a message for a store or a wire of your own;
//   - routing: [Router], [RouterFunc], [KeyHashRouter] (the partition
//     Kafka's clients pick for a key) and [RoundRobinRouter];
//   - allocation: [Allocator], [AllocatorFunc], [AllocateAveragely],
//     [AllocateAveragelyByCircle], [AllocateConsistentHash] and
//     [AllocateByConfig];
//   - flow control: [Buffer] and [BufferConfig], between a fetch loop of
//     your own and its handlers (watermarks, MaxSpan, [Buffer.Committable],
//     the ordered-consumption [Buffer.Lock]);
//   - logs: [Queue] ([WritableQueue], [ReadableQueue]) with
//     [NewMemoryQueue], and filestore's queues; [Storage] with
//     [NewMemoryStorage];
//   - progress: [Cursor], [Cursors], [CursorStore] and
//     [MemoryCursorStore].
//
// The examples of [Router], [Allocator] and [Buffer], the codec example
// and filestore's Store.OpenQueue example use each alone; the module
// examples/remote builds a partition served over the network from them,
// on which an unmodified Broker runs.
//
// # For store and coordinator implementers
//
// A user needs none of what follows; an author of a [Storage],
// [CursorStore] or [Coordinator] needs all of it, as a database/sql
// driver's author needs database/sql/driver:
//
//   - the seams' contracts: [WritableQueue], [ReadableQueue], [Queue],
//     [Storage], [CursorStore], [Coordinator], [Session], [Lease],
//     [GroupKey], [Clock] and [Timer], and [DeadlineLease] for a lease that
//     can expire by the clock;
//   - the optional interfaces the broker finds by type assertion:
//     [TryWriter], [AsyncWriter], [Releaser] and [Deduplicator] (with
//     [Duplicates]) on a queue, [SharedStorage] and
//     [TopicDeleter] on a storage, [CursorGroups] (with [Cursor] and
//     [Cursors]), [FencedCursorStore] and [HandoffCursorStore] (with
//     [MaxFinishedSet] and [ValidateFinishedSet]) on a cursor store;
//   - the checks every implementation shares: [ValidateTopicName],
//     [ValidateGroupCursorArgs] and [ValidateTopicCursorsArgs], and
//     [NewMessageID] for messages a store makes itself;
//   - errors: an implementation returns an [*Error] whose Op starts with
//     its own name ("mystore: write orders[1]"), wrapping the sentinel
//     its contract names;
//   - package codec, the binary encoding of a message, and package
//     ferrytest, whose conformance suites every implementation runs.
//
// These stay in package ferry, not in a package of their own as
// database/sql/driver is, because the broker's own options take the seam
// types (WithStorage takes a Storage) and its type assertions need the
// optional interfaces: a split would make two definitions of each.
//
// # Errors
//
// Errors wrap the sentinels of errors.go ([ErrClosed], [ErrTopicNotFound],
// [ErrInvalidTopic], [ErrInvalidMessage], [ErrMessageTooLarge], ...); match
// them with errors.Is. Each is an [*Error] naming the operation (Op), found
// with errors.As; its text reads with one "ferry:" however deep the chain
// ("ferry: send: write orders[1]: closed"), and an error of the caller's
// (a handler's, a router's) comes out as it went in. Bad input never
// panics and never writes anything.
package ferry
