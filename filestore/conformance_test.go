package filestore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
)

// features of the file store: persistent, with back-pressure; retention
// is by whole segments, so not exact in general.
var features = ferrytest.Features{Persistent: true, Block: true}

func TestQueueConformance(t *testing.T) {
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncEvery(time.Millisecond), filestore.SyncNever} {
		t.Run(p.String(), func(t *testing.T) {
			ferrytest.TestQueue(t, features, func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
				// Small segments and cache, so the suite reads from disk
				// across segments too.
				st, err := filestore.Open(t.TempDir(), filestore.WithSync(p), filestore.WithSegmentBytes(4096), filestore.WithCache(4, 1<<20))
				require.NoError(t, err)
				t.Cleanup(func() { _ = st.Close() })
				q, err := st.OpenQueue(t.Context(), meta, queue)
				require.NoError(t, err)
				return q
			})
		})
	}
}

func TestStorageConformance(t *testing.T) {
	ferrytest.TestStorage(t, features, func(t *testing.T, dir string) ferry.Storage {
		st, err := filestore.Open(dir, filestore.WithSegmentBytes(4096))
		require.NoError(t, err)
		return st
	})
}

func TestCursorStoreConformance(t *testing.T) {
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncEvery(time.Millisecond), filestore.SyncNever} {
		t.Run(p.String(), func(t *testing.T) {
			ferrytest.TestCursorStore(t, features, func(t *testing.T, dir string) ferry.CursorStore {
				st, err := filestore.Open(dir, filestore.WithSync(p))
				require.NoError(t, err)
				return st
			})
		})
	}
}

// TestCursorsListsGroupsCommittedBeyondQueues: a group whose only commits
// are on queues at or past the queues asked for is listed, all -1, as the
// doc of [ferry.CursorGroups] says and the memory store does.
func TestCursorsListsGroupsCommittedBeyondQueues(t *testing.T) {
	st, err := filestore.Open(t.TempDir())
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Commit(t.Context(), "orders", "shipping", 1, 3))
	got, err := st.Cursors(t.Context(), "orders", 1)
	require.NoError(t, err)
	require.Equal(t, []int64{-1}, got.Groups["shipping"].Offsets)
}

// TestConsumers runs the consumer suite of package ferrytest over the
// file store (messages and cursors), reopening its directory between the
// rounds of the model-based churn test. A FakeCoordinator, new with each
// opening (its tokens start again, as the store's do), lets the suite
// lose a lease (LeaseLoss) to check the store's fencing end to end.
func TestConsumers(t *testing.T) {
	var open func(t *testing.T, dir string) ferrytest.Backend
	open = func(t *testing.T, dir string) ferrytest.Backend {
		st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever), filestore.WithSegmentBytes(64<<10))
		require.NoError(t, err)
		coord := ferrytest.NewFakeCoordinator()
		return ferrytest.Backend{
			Storage: st, Cursors: st, Coordinator: coord,
			Reopen: func(t *testing.T) ferrytest.Backend { return open(t, dir) },
			Expire: func(g ferry.GroupKey, member string) { coord.Expire(g, member) },
		}
	}
	ferrytest.TestConsumers(t, ferrytest.ConsumerFeatures{}, func(t *testing.T) ferrytest.Backend {
		return open(t, t.TempDir())
	})
}
