package ferry_test

import (
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// The in-memory implementations prove themselves with the exported
// conformance suites of package ferrytest.

func TestMemoryQueueConformance(t *testing.T) {
	ferrytest.TestQueue(t, ferrytest.Features{RetentionExact: true, Block: true, Dedup: true},
		func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
			q := ferry.NewMemoryQueue(ferry.QueueID{Topic: meta.Name, Queue: queue}, meta.Retention)
			if err := q.SetDedupWindow(meta.DedupWindow); err != nil {
				t.Fatal(err)
			}
			return q
		})
}

func TestMemoryStorageQueueConformance(t *testing.T) {
	ferrytest.TestQueue(t, ferrytest.Features{RetentionExact: true, Block: true, Dedup: true},
		func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
			s := ferry.NewMemoryStorage()
			t.Cleanup(func() { _ = s.Close() })
			q, err := s.OpenQueue(t.Context(), meta, queue)
			if err != nil {
				t.Fatal(err)
			}
			return q
		})
}

func TestMemoryStorageConformance(t *testing.T) {
	ferrytest.TestStorage(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.Storage {
		return ferry.NewMemoryStorage()
	})
}

func TestMemoryCursorStoreConformance(t *testing.T) {
	ferrytest.TestCursorStore(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.CursorStore {
		return ferry.NewMemoryCursorStore()
	})
}

func TestMemoryCoordinatorConformance(t *testing.T) {
	ferrytest.TestCoordinator(t, ferrytest.CoordinatorFeatures{
		// The brokers of a process share one: a peer is the same instance.
		Peer: func(t *testing.T, c ferry.Coordinator) ferry.Coordinator { return c },
	}, func(t *testing.T) ferry.Coordinator {
		return ferry.NewMemoryCoordinator()
	})
}
