// Package bench measures Ferry side by side with the systems users would
// pick instead for in-process messaging — a buffered Go channel (the floor
// for a handoff in Go), Watermill's GoChannel, NATS core and JetStream
// (memory and file storage) embedded in-process, and nsq's go-diskqueue —
// on the same work, in one run, and reports throughput, ns/msg,
// allocations/msg, latency percentiles and each peer's ratio to Ferry.
//
// The command is cmd/ferrybench; README.md has the figures and how to
// reproduce them. This package lives in its own module so that the core
// module pulls none of the peers' dependencies.
//
// # Workloads
//
//  1. One producer goroutine, one consumer, one queue: publish → handler,
//     acknowledged or committed the way each system does it.
//  2. The same with batches (Ferry's SendBatch; the peers' batch or async
//     publish APIs where they have them).
//  3. Several producers, several queues and a group of consumers.
//  4. Latency publish → handler at a fixed offered rate.
//  5. Durable writes to disk under each sync policy.
//
// The scale workloads (issue 18) measure cost rather than speed, each
// point on its own ([MeasureScale]; the command runs each in a child
// process so that its memory figures are its own):
//
//  6. Topics: 1, 100, 10,000 topics with a consumer each — memory, setup
//     time, CPU per message spread over all of them, idle CPU.
//  7. Paced: 100,000 msgs/s from one producer to one consumer — CPU per
//     message and latency, beside a Go channel paced the same way.
//  8. Backlog: 1M messages kept with no consumer — bytes per message
//     beyond the body, and a full GC's duration.
//  9. Rebalance: a member joins a group owning 256 queues under CPU-bound
//     load — time until it holds its share.
//
// Every figure is a median over runs, and every ratio is taken within one
// run before the median, so that noise from a shared machine cancels.
package bench
