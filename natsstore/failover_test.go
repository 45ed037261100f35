package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestLeaderShutdown writes to an R3 queue while the stream's leader
// node shuts down (in the process: a clean hand-over, not a crash):
// every acknowledged write is there afterwards, once, at the offset it
// was given, and the offsets stay contiguous.
func TestLeaderShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no cluster")
	}
	c := newTriple(t)
	defer c.shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	st := openStore(t, c, "lf")
	defer st.Close()
	meta := ferry.TopicMeta{Name: "orders", Queues: 1}
	q, err := st.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	defer q.Close()

	js := c.connect(t)
	stream, err := js.Stream(ctx, "lf_orders_0")
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	leader := info.Cluster.Leader

	acked := map[int64]string{}
	var slowest time.Duration
	write := func(phase string, n int) {
		for i := range n {
			batch := newMsgs("orders", 1+i%3)
			for j, m := range batch {
				m.Body = fmt.Appendf(nil, "%s-%d-%d", phase, i, j)
			}
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			began := time.Now()
			first, err := q.Write(wctx, batch)
			slowest = max(slowest, time.Since(began))
			wcancel()
			require.NoError(t, err, "write %s-%d", phase, i)
			for j, m := range batch {
				acked[first+int64(j)] = string(m.Body)
			}
		}
	}
	write("before", 100)
	stopped := make(chan time.Time, 1)
	go func() {
		for _, s := range c.servers {
			if s.Name() == leader {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
		stopped <- time.Now()
	}()
	start := time.Now()
	write("during", 200)
	at := <-stopped
	write("after", 100)
	t.Logf("leader %s shut down %v into the writes; %d messages acknowledged, the slowest write took %v", leader, at.Sub(start).Round(time.Millisecond), len(acked), slowest.Round(time.Millisecond))

	info, err = stream.Info(ctx)
	require.NoError(t, err)
	require.NotEqual(t, leader, info.Cluster.Leader)
	oldest, next := q.Offsets()
	require.Equal(t, int64(0), oldest)
	require.Equal(t, int64(len(acked)), next, "offsets contiguous, nothing stored twice")
	dst := make([]*ferry.EnhancedMessage, 64)
	for off := int64(0); off < next; {
		n, err := q.Read(ctx, off, dst)
		require.NoError(t, err)
		for _, m := range dst[:n] {
			require.Equal(t, acked[off], string(m.Body), "offset %d", off)
			off++
		}
	}
}
