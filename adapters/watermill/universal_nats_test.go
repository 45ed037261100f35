package ferrywm_test

import (
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestUniversalNATS runs the universal suite over natsstore: the broker's
// queues, topics, cursors and consumer groups in JetStream on one
// embedded server (file storage in a temporary directory), with the same
// features as memory and filestore, and nacks retried off the queue (each
// retry write has an ID of its own: natsstore drops a write whose ID it
// saw within its duplicate window).
func TestUniversalNATS(t *testing.T) {
	t.Parallel()
	runUniversal(t, natsBroker(t), nil)
}

// natsBroker returns a broker over natsstore on an embedded NATS server
// of its own, all of it closed when t and its (parallel) subtests are done.
func natsBroker(t *testing.T) *ferry.Broker {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		// Every stream reserves its byte bound (Ferry's default retention)
		// against the server's store limit: the suite makes hundreds.
		JetStreamMaxStore: 1 << 50,
	})
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	require.True(t, srv.ReadyForConnections(10*time.Second), "nats server not ready")
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := natsstore.Open(t.Context(), js)
	require.NoError(t, err)
	// A short TTL: a member that the suite abandons without closing frees
	// its queues in 2 s rather than 15.
	co, err := natsstore.NewCoordinator(t.Context(), js, natsstore.WithTTL(2*time.Second))
	require.NoError(t, err)
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, b.Close())
		require.NoError(t, co.Close())
		require.NoError(t, st.Close())
	})
	return b
}
