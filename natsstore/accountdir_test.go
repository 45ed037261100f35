package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/natsstore"
)

// TestCreateAfterLastStreamDeleted: a deployment opened at once after
// the account's last stream was deleted is made, every time. Deleting
// an account's last stream, nats-server removes the account's streams
// directory and then the account's directory in a goroutine (stream.go,
// "no op if not empty"), racing the next stream's store being made:
// "could not create storage directory - mkdir …/jetstream/$G/streams: no
// such file or directory", answered as code 10049 "error creating store
// for stream". A user who deletes their last topic and creates another
// meets the same race. The test's own server, so that its account holds
// only what the loop makes.
func TestCreateAfterLastStreamDeleted(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: testMaxStore, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	require.True(t, s.ReadyForConnections(10*time.Second), "nats server not ready")
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const runs = 200
	for i := range runs {
		st, err := natsstore.Open(ctx, js, natsstore.WithPrefix(fmt.Sprintf("ad%d", i)))
		require.NoError(t, err, "run %d: open right after the account's last stream was deleted", i)
		require.NoError(t, st.Close())
		names := js.StreamNames(ctx)
		var drop []string
		for name := range names.Name() {
			drop = append(drop, name)
		}
		require.NoError(t, names.Err())
		for _, name := range drop {
			require.NoError(t, js.DeleteStream(ctx, name))
		}
	}
}
