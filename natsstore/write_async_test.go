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
