package remote_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/examples/remote"
	"github.com/ferrymq/ferry/ferrytest"
)

// TestConsumers runs the consumer suite of package ferrytest with every
// broker's queues and cursors on a remote server: brokers over a
// remote.Storage deliver, commit, resume and rebalance as over a local
// store. A FakeCoordinator lets the suite lose a lease. A reopen starts
// a new server on the same directory (in memory: see memDir). Scale 0.1,
// as the suite suggests for a slow backend: every call is a round trip,
// and the full counts take 20 s alone under -race on two cores (they
// pass too), which would make the module's tests slow.
func TestConsumers(t *testing.T) {
	var open func(t *testing.T, dir string) ferrytest.Backend
	open = func(t *testing.T, dir string) ferrytest.Backend {
		srv := startServer(t, dir, "127.0.0.1:0")
		st, err := remote.NewStorage(srv.addr)
		require.NoError(t, err)
		coord := ferrytest.NewFakeCoordinator()
		owned := ownedStorage{st, srv}
		return ferrytest.Backend{
			Storage: owned, Cursors: owned, Coordinator: coord,
			Reopen: func(t *testing.T) ferrytest.Backend { return open(t, dir) },
			Expire: func(g ferry.GroupKey, member string) { coord.Expire(g, member) },
		}
	}
	ferrytest.TestConsumers(t, ferrytest.ConsumerFeatures{Scale: 0.1, Timeout: features.Timeout}, func(t *testing.T) ferrytest.Backend {
		return open(t, memDir(t))
	})
}
