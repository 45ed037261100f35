package remote_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/examples/remote"
	"github.com/ferrymq/ferry/ferrytest"
)

// features of a remote queue over filestore: persistent (the server's
// store is), with back-pressure (TryWrite and Release cross the wire);
// retention is filestore's, by whole segments. The watchdog waits 30 s,
// not 10: filestore syncs its directory when it rolls a segment, even
// with SyncNever, and on a shared disk under load one such fsync took
// over 10 s (ConcurrentRetention, which rolls small segments often, was
// reported hung in 2 of 5 runs with five test binaries at once). The
// watchdog catches hangs; it does not time the store.
var features = ferrytest.Features{Persistent: true, Block: true, Timeout: 30 * time.Second}

func TestQueueConformance(t *testing.T) {
	ferrytest.TestQueue(t, features, func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
		// Small segments, so retention drops segments within the suite.
		srv := startServer(t, memDir(t), "127.0.0.1:0")
		st := dial(t, srv.addr)
		q, err := st.OpenQueue(t.Context(), meta, queue)
		require.NoError(t, err)
		return q
	})
}

// ownedStorage is a client that stops its server when it closes, so the
// suite's reopen of a dir gets a new server on the same store.
type ownedStorage struct {
	*remote.Storage
	srv *server
}

func (o ownedStorage) Close() error {
	err := o.Storage.Close()
	o.srv.stop()
	return err
}

func TestStorageConformance(t *testing.T) {
	ferrytest.TestStorage(t, features, func(t *testing.T, dir string) ferry.Storage {
		srv := startServer(t, dir, "127.0.0.1:0")
		st, err := remote.NewStorage(srv.addr)
		require.NoError(t, err)
		return ownedStorage{st, srv}
	})
}

func TestCursorStoreConformance(t *testing.T) {
	// Fencing tokens live in the server's filestore, in memory: a new
	// server starts them again, as a reopened filestore does.
	ferrytest.TestCursorStore(t, features, func(t *testing.T, dir string) ferry.CursorStore {
		srv := startServer(t, dir, "127.0.0.1:0")
		st, err := remote.NewStorage(srv.addr)
		require.NoError(t, err)
		return ownedStorage{st, srv}
	})
}
