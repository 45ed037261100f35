package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

func newMsgs(topic string, n int) []*ferry.EnhancedMessage {
	out := make([]*ferry.EnhancedMessage, n)
	now := time.Now()
	for i := range out {
		out[i] = &ferry.EnhancedMessage{Message: ferry.Message{Topic: topic, Body: []byte(fmt.Sprint(i))}, ID: ferry.NewMessageID(now), BornUnixNano: now.UnixNano()}
	}
	return out
}

// TestWriteRetried writes messages again, as a writer does when it
// cannot tell whether its first try was stored (a timeout after
// sending): the queue stores each once and returns the offset of the
// first try.
func TestWriteRetried(t *testing.T) {
	for _, c := range []struct {
		name string
		cl   func(testing.TB) *cluster
	}{{"Single", singleServer}, {"Cluster", tripleServer}} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "Cluster" && testing.Short() {
				t.Skip("-short: no cluster")
			}
			ctx := t.Context()
			st := openStore(t, c.cl(t), fmt.Sprintf("w%d", fresh.Add(1)))
			defer st.Close()
			q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "orders.eu", Queues: 1}, 0)
			require.NoError(t, err)
			defer q.Close()

			require.NoError(t, errors.Join(func() error { _, err := q.Write(ctx, newMsgs("orders.eu", 2)); return err }()))
			one := newMsgs("orders.eu", 1)
			first, err := q.Write(ctx, one)
			require.NoError(t, err)
			stored := one[0].StoreUnixNano
			again, err := q.Write(ctx, one)
			require.NoError(t, err)
			require.Equal(t, first, again, "a retried single write")
			require.Equal(t, stored, one[0].StoreUnixNano, "StoreTime of a retried single write")

			batch := newMsgs("orders.eu", 5)
			first, err = q.Write(ctx, batch)
			require.NoError(t, err)
			_, err = q.Write(ctx, newMsgs("orders.eu", 3)) // others write meanwhile
			require.NoError(t, err)
			stored = batch[0].StoreUnixNano
			again, err = q.Write(ctx, batch)
			require.NoError(t, err)
			require.Equal(t, first, again, "a retried batch")
			require.Equal(t, stored, batch[4].StoreUnixNano, "StoreTime of a retried batch")
			oldest, next := q.Offsets()
			require.Equal(t, int64(0), oldest)
			require.Equal(t, int64(2+1+5+3), next, "nothing stored twice")
			for i, m := range batch {
				require.Equal(t, first+int64(i), m.Offset)
			}

			_, err = q.Write(ctx, newMsgs("orders.eu", natsstore.MaxBatch+1))
			require.ErrorIs(t, err, ferry.ErrMessageTooLarge)
			full, err := q.Write(ctx, newMsgs("orders.eu", natsstore.MaxBatch))
			require.NoError(t, err)
			require.Equal(t, next, full)
		})
	}
}

// TestOptions: bad option values, a nil JetStream and a nil context are
// ErrInvalidOption from the constructors.
func TestOptions(t *testing.T) {
	js := singleServer(t).connect(t)
	for _, o := range []natsstore.Option{
		natsstore.WithPrefix(""), natsstore.WithPrefix("a.b"), natsstore.WithReplicas(2),
		natsstore.WithTTL(time.Millisecond), natsstore.WithSafety(1), natsstore.WithOpTimeout(0),
		natsstore.WithRecordOverhead(-1), natsstore.WithDuplicateWindow(0),
	} {
		_, err := natsstore.Open(context.Background(), js, o)
		require.ErrorIs(t, err, ferry.ErrInvalidOption)
		_, err = natsstore.NewCoordinator(context.Background(), js, o)
		require.ErrorIs(t, err, ferry.ErrInvalidOption)
	}
	_, err := natsstore.Open(context.Background(), nil)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = natsstore.Open(nil, js) //lint:ignore SA1012 a nil context is the input under test
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = natsstore.NewCoordinator(nil, js) //lint:ignore SA1012 a nil context is the input under test
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// TestBatchFull: a batch that does not fit a full Block queue is
// ErrQueueFull from TryWrite and stores nothing, on one server and on
// three (the batch's outcome comes with its commit: its first message
// is not acknowledged on its own).
func TestBatchFull(t *testing.T) {
	for _, c := range []struct {
		name string
		cl   func(testing.TB) *cluster
	}{{"Single", singleServer}, {"Cluster", tripleServer}} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "Cluster" && testing.Short() {
				t.Skip("-short: no cluster")
			}
			ctx := t.Context()
			st := openStore(t, c.cl(t), fmt.Sprintf("bf%d", fresh.Add(1)))
			defer st.Close()
			meta := ferry.TopicMeta{Name: "orders", Queues: 1, Retention: ferry.Retention{MaxMessages: 4, Overflow: ferry.Block}}
			q, err := st.OpenQueue(ctx, meta, 0)
			require.NoError(t, err)
			defer q.Close()
			_, err = q.Write(ctx, newMsgs("orders", 3))
			require.NoError(t, err)
			_, err = q.(ferry.TryWriter).TryWrite(newMsgs("orders", 2))
			require.ErrorIs(t, err, ferry.ErrQueueFull)
			oldest, next := q.Offsets()
			require.Equal(t, int64(0), oldest)
			require.Equal(t, int64(3), next, "nothing of the refused batch stored")
			first, err := q.Write(ctx, newMsgs("orders", 1))
			require.NoError(t, err)
			require.Equal(t, int64(3), first)
		})
	}
}

// TestBatchMessageIDs: of a batch's messages without a dedup key only
// the first is stored with a Nats-Msg-Id (its MessageID), by Write and
// by WriteAsync; keyed messages carry their key's. The one ID is enough:
// a batch written again (as a writer does when a try's outcome is
// unknown, and as WriteAsync's recovery does) is found where it was
// stored, nothing stored twice.
func TestBatchMessageIDs(t *testing.T) {
	ctx := t.Context()
	c := singleServer(t)
	st := openStore(t, c, fmt.Sprintf("bi%d", fresh.Add(1)))
	defer st.Close()
	q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "t", Queues: 1, DedupWindow: time.Minute}, 0)
	require.NoError(t, err)
	defer q.Close()
	js := c.connect(t)
	stream, err := js.Stream(ctx, natsstore.StreamOf(q))
	require.NoError(t, err)
	msgID := func(off int64) string {
		t.Helper()
		raw, err := stream.GetMsg(ctx, uint64(off)+1)
		require.NoError(t, err)
		return raw.Header.Get("Nats-Msg-Id")
	}

	batch := newMsgs("t", 4)
	first, err := q.Write(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, batch[0].ID.String(), msgID(first))
	for i := 1; i < len(batch); i++ {
		require.Empty(t, msgID(first+int64(i)), "message %d of an unkeyed batch", i)
	}
	again, err := q.Write(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, first, again, "a batch written again")

	async := newMsgs("t", 3)
	got := make(chan error, 1)
	var afirst int64
	q.(ferry.AsyncWriter).WriteAsync(ctx, async, func(f int64, err error) { afirst = f; got <- err })
	require.NoError(t, <-got)
	require.Equal(t, async[0].ID.String(), msgID(afirst))
	require.Empty(t, msgID(afirst+1))
	again, err = q.Write(ctx, async)
	require.NoError(t, err)
	require.Equal(t, afirst, again, "an asynchronous batch written again")

	mixed := newMsgs("t", 4)
	mixed[0].DedupKey, mixed[3].DedupKey = "k0", "k3"
	mfirst, err := q.Write(ctx, mixed)
	require.NoError(t, err)
	require.NotEmpty(t, msgID(mfirst), "a keyed message")
	require.NotEqual(t, mixed[0].ID.String(), msgID(mfirst))
	require.Equal(t, mixed[1].ID.String(), msgID(mfirst+1), "the first unkeyed message")
	require.Empty(t, msgID(mfirst+2))
	require.NotEmpty(t, msgID(mfirst+3), "a keyed message")
	_, next := q.Offsets()
	require.Equal(t, int64(4+3+4), next, "nothing stored twice")
}
