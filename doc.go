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
// [Message] into an [EnhancedMessage] (ID, BornTime, BornAddress,
// Producer), asks its [Router] for a queue and writes it there:
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
// # Seams
//
// Every moving part is a small interface with an in-memory default and a
// conformance suite in package ferrytest: [Queue] and [Storage] (where
// messages live), [Router], [CursorStore]. Package ferrytest also holds a
// fault-injecting fake queue for testing code that publishes.
//
// # Errors
//
// Errors wrap the sentinels of errors.go ([ErrClosed], [ErrTopicNotFound],
// [ErrInvalidTopic], [ErrInvalidMessage], [ErrMessageTooLarge], ...); match
// them with errors.Is. Bad input never panics and never writes anything.
package ferry
