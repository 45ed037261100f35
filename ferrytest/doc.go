// Package ferrytest is the test kit for Ferry: exported conformance suites
// for its seams, a fault-injecting fake queue and storage, and a helper
// that gives a test a ready broker.
//
// # Conformance suites
//
// [TestQueue], [TestStorage], [TestCursorStore], [TestAllocator] and
// [TestCoordinator] check that an implementation of [ferry.Queue],
// [ferry.Storage], [ferry.CursorStore], [ferry.Allocator] or
// [ferry.Coordinator] keeps the contract its doc states (TestCursorStore
// checks the optional [ferry.CursorGroups] and [ferry.FencedCursorStore]
// too, when the store has them), a nil context included: every method
// taking one must refuse it with [ferry.ErrInvalidOption], never panic.
// Each takes a factory and builds a fresh instance for every subtest, so
// subtests never see each other's state, and runs every subtest under a
// watchdog: a subtest that makes no progress within
// [Features].Timeout fails with the stacks of every goroutine, its context
// is cancelled and its instance closed; if it still does not return, the
// test binary panics with the stacks instead of hanging. [Features] says
// what an implementation may legitimately leave out (persistence across
// reopen, exact retention, back-pressure). Every implementation in the
// Ferry repository runs these suites in its own tests; so can yours:
//
//	func TestMyQueue(t *testing.T) {
//		ferrytest.TestQueue(t, ferrytest.Features{RetentionExact: true},
//			func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
//				return myqueue.New(meta, queue)
//			})
//	}
//
// [TestConsumers] checks the consumers themselves over a whole backend:
// brokers over the [Backend] (a Storage, a CursorStore and a Coordinator)
// a factory returns deliver exactly once in a stable group, resume from
// committed cursors, keep per-key order, broadcast, poll and commit, and
// lose nothing while members churn, including a model-based churn test
// that reopens the backend between rounds when it can, and, with
// [Backend].Expire, stop at once when a lease is lost, the next owner
// resuming from the last fenced commit. The root package runs it on
// memory, this package on memory with a [FakeCoordinator]; filestore and
// natsstore run it in their own tests;
// [ConsumerFeatures] scales it down for a slow backend. Its helpers
// ([Produce], [Tally], [StartConsumer], [Owners]) serve other consumer
// tests too.
//
// The suites use only the testing package, so importing ferrytest adds no
// dependency to a module.
//
// # Fakes
//
// [FakeQueue] is a [ferry.Queue] that records every write and can fail or
// delay the nth one; [FakeStorage] is a [ferry.Storage] that hands out
// FakeQueues. [NewFakeBroker] gives a test a broker over a FakeStorage,
// closed when the test ends, so code that publishes through a
// [ferry.Producer] can be tested, failures included, with no other set-up.
// [FakeCoordinator] is a [ferry.Coordinator] whose sessions expire and
// whose leases are lost on demand, as a distributed coordinator's do when
// a member goes silent or a renewal fails, so consumers can be tested
// through those failures within one process. [FakeClock] is a
// [ferry.Clock] that moves only when told ([FakeClock.Advance]): given to
// a broker with [ferry.WithClock], it runs delayed messages and retry
// backoffs of hours in milliseconds, and a test can check that nothing
// arrives before its time.
package ferrytest
