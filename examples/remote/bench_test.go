package remote_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// The pipeline the benchmark measures: one producer (SendAsync, one
// topic of one queue, 100-byte bodies) → the queue → one consumer group
// of one member. Only the storage differs: a remote queue on a server
// over loopback (filestore on the server, SyncNever), or natsstore on an
// embedded NATS server (JetStream file storage, R1). Neither fdatasyncs
// each write: JetStream syncs every two minutes by default, filestore's
// SyncNever leaves it to the kernel. Cursors and the coordinator are the
// broker's in-memory ones in both.
const benchBody = 100

// pipeline sends n messages through st and returns when the consumer has
// had them all.
func pipeline(tb testing.TB, st ferry.Storage, topic string, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang fails; it bounds no timing
	defer cancel()
	b, err := ferry.NewBroker(ferry.WithStorage(st))
	require.NoError(tb, err)
	defer b.Close()
	require.NoError(tb, b.CreateTopic(ctx, ferry.TopicMeta{Name: topic, Queues: 1}))
	var got atomic.Int64
	all := make(chan struct{})
	c, err := b.NewConsumer("bench", topic, ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		if got.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}), ferry.WithStartFrom(ferry.Earliest))
	require.NoError(tb, err)
	require.NoError(tb, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(tb, err)
	defer p.Close()
	body := make([]byte, benchBody)
	var failed atomic.Int64
	if b, ok := tb.(*testing.B); ok {
		b.ResetTimer()
	}
	for range n {
		require.NoError(tb, p.SendAsync(ctx, &ferry.Message{Topic: topic, Body: body}, func(_ ferry.SendResult, err error) {
			if err != nil {
				failed.Add(1)
			}
		}))
	}
	require.NoError(tb, p.Flush(ctx))
	require.Zero(tb, failed.Load(), "sends failed")
	select {
	case <-all:
	case <-ctx.Done():
		tb.Fatalf("consumed %d of %d", got.Load(), n)
	}
	if b, ok := tb.(*testing.B); ok {
		b.StopTimer()
	}
}

// remoteStorage serves a filestore on loopback and returns its client.
func remoteStorage(tb testing.TB) ferry.Storage {
	srv := startServer(tb, tb.TempDir(), "127.0.0.1:0")
	return dial(tb, srv.addr)
}

// natsStorage starts an embedded JetStream server and returns a
// natsstore on it.
func natsStorage(tb testing.TB, prefix string) ferry.Storage {
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tb.TempDir(), JetStreamMaxStore: 1 << 40, NoLog: true, NoSigs: true})
	require.NoError(tb, err)
	s.Start()
	tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	require.True(tb, s.ReadyForConnections(10*time.Second), "nats server not ready")
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(tb, err)
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	st, err := natsstore.Open(context.Background(), js, natsstore.WithPrefix(prefix), natsstore.WithOpTimeout(10*time.Second))
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

var benchRun atomic.Int64

// BenchmarkPipeline compares the remote queue with natsstore R1 on the
// same pipeline, in the same run:
//
//	go test -run '^$' -bench Pipeline -benchtime 20000x
func BenchmarkPipeline(b *testing.B) {
	for _, c := range []struct {
		name string
		open func(testing.TB) ferry.Storage
	}{
		{"remote", remoteStorage},
		{"natsstore", func(tb testing.TB) ferry.Storage { return natsStorage(tb, fmt.Sprintf("b%d", benchRun.Add(1))) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			st := c.open(b)
			b.SetBytes(benchBody)
			pipeline(b, st, fmt.Sprintf("bench%d", benchRun.Add(1)), b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// TestPipeline runs the benchmark's pipelines small, so that they cannot
// rot: each delivers every message it sends.
func TestPipeline(t *testing.T) {
	pipeline(t, remoteStorage(t), "small", 500)
	pipeline(t, natsStorage(t, "small"), "small", 500)
}
