// Package ferryotel traces and measures Ferry with OpenTelemetry: two
// [ferry.Hook] values, [Tracing] and [Metrics], that a broker takes with
// [ferry.WithHooks].
//
//	tracing := ferryotel.NewTracing()      // global provider and propagator
//	metrics, err := ferryotel.NewMetrics() // global meter provider
//	b, err := ferry.NewBroker(ferry.WithHooks(tracing, metrics))
//	reg, err := metrics.ObserveLag(b, "billing", "orders")
//	defer reg.Unregister()
//
// Register the hooks on the broker rather than on one consumer
// ([ferry.WithConsumerHooks]): a consumer sends its dead letters through a
// producer of the broker's, which has the broker's hooks only.
//
// # Spans
//
// Span names and attributes follow the OpenTelemetry messaging semantic
// conventions (v1.43): messaging.system is "ferry", the destination is
// the topic (messaging.destination.name) and its queue
// (messaging.destination.partition.id), the consumer group is
// messaging.consumer.group.name, the message ID messaging.message.id.
// What the conventions have no name for is ferry.*: the offset
// ([OffsetKey]), the routing key and tag, the attempt ([AttemptKey]).
//
//   - "send <topic>", kind producer, operation type send: one per message
//     a producer writes, Send or SendBatch, from the stamped and routed
//     message to its write; a child of the span in the Send's context.
//     Its context goes into the message's headers through the propagator
//     (W3C traceparent by default), in a copy of the headers: the
//     sender's map is never changed. A failed write ends it with the
//     error (status Error, an exception event, error.type).
//   - "process <topic>", kind consumer, operation type process: one per
//     handler call, a retry being another call of the same message with
//     the next [AttemptKey]. A child of the send span, through the
//     headers, or linked to it ([WithLinkedProcess]). The handler's
//     context carries it, so the handler's own spans nest in it. A
//     failed call (an error or a panic) ends it with the error.
//     A [ferry.PullConsumer] has no handler hook: its loop makes the
//     span with [Tracing.StartProcess].
//   - "dead_letter <topic>", kind internal, operation type settle: a
//     message went to the dead-letter topic; a child of (or linked to)
//     the send span, with where the dead letter went, after how many
//     attempts, and the last error as an exception event.
//   - The dead letter's own "send <dead-letter topic>": the consumer
//     sends it with no span in context, so it continues the trace its
//     headers carry (the original's send span); it says what it is the
//     dead letter of ([OriginTopicKey], [OriginPartitionKey],
//     [OriginOffsetKey], [DeadLetterAttemptsKey], the group). A reader of
//     the dead-letter topic gets a process span under it.
//
// A span that is not recorded (a no-op provider, a sampler's drop) costs
// a few allocations; when it has no context to propagate, the message's
// headers stay as they were.
//
// # Metrics
//
// [Metrics] makes these instruments (durations in seconds):
//
//   - messaging.client.sent.messages (counter): each message a producer
//     tried to write, by topic and queue; a failed one has error.type, so
//     the messages written are those without it.
//   - messaging.client.operation.duration (histogram, operation send):
//     from the message's BornTime to its write.
//   - messaging.client.consumed.messages (counter): each handler call, by
//     group, topic and queue (a retry counts again).
//   - messaging.process.duration (histogram): each handler call; a failed
//     one has error.type, so the failures are the histogram's count with
//     it.
//   - ferry.consumer.dead_lettered (counter): by topic, queue and
//     dead-letter topic ([DeadLetterTopicKey]).
//   - ferry.consumer.commit.duration (histogram): each cursor commit, by
//     group, topic and queue; a failed one has error.type.
//   - ferry.consumer.rebalanced (counter): queues taken and given up
//     ([AssignedKey]).
//   - ferry.consumer.resets (counter): cursors reset after falling out of
//     retention.
//   - ferry.consumer.lag (gauge): per group and queue, for what
//     [Metrics.ObserveLag] and [Metrics.ObserveGroups] register.
//   - ferry.consumer.buffer.messages, ferry.consumer.buffer.bytes,
//     ferry.consumer.in_flight and ferry.consumer.buffer.paused (gauges):
//     per queue a consumer holds, for what [Metrics.ObserveConsumer]
//     registers.
//
// The gauges are callbacks the meter provider's readers run when they
// collect: nothing here starts a goroutine.
//
// # Concurrency
//
// [Tracing] and [Metrics] are safe for concurrent use: a broker calls
// its hooks from every producer's and consumer's goroutines.
package ferryotel
