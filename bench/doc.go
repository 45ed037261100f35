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
// Every figure is a median over runs, and every ratio is taken within one
// run before the median, so that noise from a shared machine cancels.
package bench
