package natsstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestWriteAsyncLeaderChange: the stream's leader steps down while
// batches are pipelined (WriteAsync). The old leader drops what it was
// receiving or proposing (an atomic batch it dropped is answered
// "incomplete", 10176; a publish it dropped is not answered at all)
// while the writes behind go on to the new one. Every write is
// reported, in the order begun, within the op timeout or so (the
// pipeline waited for an ack that never came, for ever); the stream
// holds exactly the writes reported stored, in the order begun; a write
// not stored is written again in its place when nothing behind it was
// stored, and fails otherwise.
func TestWriteAsyncLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no cluster")
	}
	c := tripleServer(t)
	prefix := fmt.Sprintf("wl%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	const opTimeout = 3 * time.Second
	st := openStore(t, c, prefix, natsstore.WithOpTimeout(opTimeout))
	defer st.Close()
	ctx := t.Context()
	q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	defer q.Close()
	aw := q.(ferry.AsyncWriter)
	nc := c.connect(t).Conn()

	type outcome struct {
		k     int
		first int64
		err   error
	}
	const rounds, writes, per = 3, 40, 3
	var stored []*ferry.EnhancedMessage
	failed := 0
	for r := range rounds {
		got := make(chan outcome, writes)
		batches := make([][]*ferry.EnhancedMessage, writes)
		for k := range writes {
			batches[k] = newMsgs("t", per)
			aw.WriteAsync(ctx, batches[k], func(first int64, err error) { got <- outcome{k, first, err} })
			if k == writes/4 {
				_, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+natsstore.StreamOf(q), nil, 5*time.Second)
				require.NoError(t, err, "round %d: step down", r)
			}
		}
		last := int64(-1)
		for i := range writes {
			var o outcome
			select {
			case o = <-got:
			case <-time.After(10 * opTimeout):
				t.Fatalf("round %d: write %d not reported %v after the last", r, i, 10*opTimeout)
			}
			require.Equal(t, i, o.k, "round %d: reported in the order begun", r)
			if o.err != nil {
				t.Logf("round %d: write %d: %v", r, o.k, o.err)
				failed++
				continue
			}
			require.Greater(t, o.first, last, "round %d: write %d stored in the order begun", r, o.k)
			last = o.first
			stored = append(stored, batches[o.k]...)
		}
	}
	t.Logf("%d of %d writes failed", failed, rounds*writes)
	_, next := q.Offsets()
	require.Equal(t, int64(len(stored)), next, "the stream holds the writes reported stored")
	dst := make([]*ferry.EnhancedMessage, 64)
	for off := int64(0); off < next; {
		n, err := q.Read(ctx, off, dst)
		require.NoError(t, err)
		for _, m := range dst[:n] {
			require.Equal(t, stored[m.Offset].ID, m.ID, "offset %d", m.Offset)
		}
		off += int64(n)
	}
}

// TestWriteAsyncNoResponders: the stream stops listening on the queue's
// subject for a moment (as while its leader is elected), so that a
// pipelined write is answered "no responders", and the writes begun
// after it are stored. nats.go's asynchronous publish would send the
// refused write again by itself a little later, behind them, and report
// it stored there, out of the order begun; natsstore asks it not to, and
// settles the write itself (see recover): every write is reported in the
// order begun, those stored are in that order, and the stream holds
// exactly them.
func TestWriteAsyncNoResponders(t *testing.T) {
	c := singleServer(t)
	prefix := fmt.Sprintf("wn%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	js := c.connect(t)
	st, err := natsstore.Open(t.Context(), js, natsstore.WithPrefix(prefix))
	require.NoError(t, err)
	defer st.Close()
	ctx := t.Context()
	q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	defer q.Close()
	aw := q.(ferry.AsyncWriter)
	stream, err := js.Stream(ctx, natsstore.StreamOf(q))
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	subjects := cfg.Subjects
	cfg.Subjects = []string{prefix + ".elsewhere"}
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err, "stop listening")

	type outcome struct {
		k     int
		first int64
		err   error
	}
	const writes = 6
	got := make(chan outcome, writes)
	batches := make([][]*ferry.EnhancedMessage, writes)
	begin := func(k int) {
		batches[k] = newMsgs("t", 1)
		aw.WriteAsync(ctx, batches[k], func(first int64, err error) { got <- outcome{k, first, err} })
	}
	begin(0)
	// The server answers the publish before the flush's PONG: write 0 is
	// refused by now, and nats.go would send it again in 250 ms.
	require.NoError(t, js.Conn().Flush())
	cfg.Subjects = subjects
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err, "listen again")
	for k := 1; k < writes; k++ {
		begin(k)
	}
	var stored []*ferry.EnhancedMessage
	last := int64(-1)
	for i := range writes {
		var o outcome
		select {
		case o = <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("write %d not reported", i)
		}
		require.Equal(t, i, o.k, "reported in the order begun")
		if o.err != nil {
			t.Logf("write %d: %v", o.k, o.err)
			continue
		}
		require.Greater(t, o.first, last, "write %d stored in the order begun", o.k)
		last = o.first
		stored = append(stored, batches[o.k]...)
	}
	_, next := q.Offsets()
	require.Equal(t, int64(len(stored)), next, "the stream holds the writes reported stored")
	dst := make([]*ferry.EnhancedMessage, writes)
	n, err := q.Read(ctx, 0, dst[:next])
	require.NoError(t, err)
	for _, m := range dst[:n] {
		require.Equal(t, stored[m.Offset].ID, m.ID, "offset %d", m.Offset)
	}
}
