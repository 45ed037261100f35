package ferrytest_test

import (
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// The fakes are implementations too: without faults they keep the
// contracts.

func TestFakeQueueConformance(t *testing.T) {
	ferrytest.TestQueue(t, ferrytest.Features{RetentionExact: true, Block: true},
		func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
			return ferrytest.NewFakeQueue(ferry.QueueID{Topic: meta.Name, Queue: queue}, meta.Retention)
		})
}

func TestFakeStorageQueueConformance(t *testing.T) {
	ferrytest.TestQueue(t, ferrytest.Features{RetentionExact: true, Block: true},
		func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
			s := ferrytest.NewFakeStorage()
			t.Cleanup(func() { _ = s.Close() })
			q, err := s.OpenQueue(t.Context(), meta, queue)
			if err != nil {
				t.Fatal(err)
			}
			return q
		})
}

func TestFakeStorageConformance(t *testing.T) {
	ferrytest.TestStorage(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.Storage {
		return ferrytest.NewFakeStorage()
	})
}

func TestFakeCoordinatorConformance(t *testing.T) {
	ferrytest.TestCoordinator(t, ferrytest.CoordinatorFeatures{
		Expire: func(c ferry.Coordinator, g ferry.GroupKey, member string) {
			c.(*ferrytest.FakeCoordinator).Expire(g, member)
		},
		// Brokers share one fake, as they share a MemoryCoordinator.
		Peer: func(t *testing.T, c ferry.Coordinator) ferry.Coordinator { return c },
	}, func(t *testing.T) ferry.Coordinator { return ferrytest.NewFakeCoordinator() })
}

// TestFakeCoordinatorConsumers runs the consumer suite over memory
// storage and cursors with a FakeCoordinator, whose Expire lets the
// suite lose a lease (LeaseLoss), scaled down: the memory backend runs
// the rest in full (package ferry's TestConsumers).
func TestFakeCoordinatorConsumers(t *testing.T) {
	ferrytest.TestConsumers(t, ferrytest.ConsumerFeatures{Scale: 0.25}, func(t *testing.T) ferrytest.Backend {
		coord := ferrytest.NewFakeCoordinator()
		return ferrytest.Backend{
			Storage: ferry.NewMemoryStorage(), Cursors: ferry.NewMemoryCursorStore(), Coordinator: coord,
			Expire: func(g ferry.GroupKey, member string) { coord.Expire(g, member) },
		}
	})
}
