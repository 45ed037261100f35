package natsstore_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestTail: a Read waiting at the end of a queue is woken by a write
// through another Store (another process) and returns the message the
// tail was pushed; a message the tail holds but retention has dropped
// (MaxMessages) is out of range, not served from the tail.
func TestTail(t *testing.T) {
	for _, c := range []struct {
		name string
		cl   func(testing.TB) *cluster
	}{{"Single", singleServer}, {"Cluster", tripleServer}} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "Cluster" && testing.Short() {
				t.Skip("-short: no cluster")
			}
			ctx := t.Context()
			prefix := fmt.Sprintf("tl%d", fresh.Add(1))
			meta := ferry.TopicMeta{Name: "orders", Queues: 1, Retention: ferry.Retention{MaxMessages: 2}}
			open := func() (*natsstore.Store, ferry.Queue) {
				st := openStore(t, c.cl(t), prefix)
				q, err := st.OpenQueue(ctx, meta, 0)
				require.NoError(t, err)
				return st, q
			}
			rs, rq := open()
			defer rs.Close()
			ws, wq := open()
			defer ws.Close()

			type result struct {
				m   *ferry.EnhancedMessage
				err error
			}
			read := func(off int64) <-chan result {
				ch := make(chan result, 1)
				go func() {
					dst := make([]*ferry.EnhancedMessage, 4)
					n, err := rq.Read(ctx, off, dst)
					if err == nil && n == 0 {
						err = fmt.Errorf("Read returned nothing")
					}
					ch <- result{dst[0], err}
				}()
				return ch
			}
			for i := range 3 {
				ch := read(int64(i))
				msgs := newMsgs("orders", 1)
				msgs[0].Body = fmt.Appendf(nil, "m%d", i)
				first, err := wq.Write(ctx, msgs)
				require.NoError(t, err)
				require.Equal(t, int64(i), first)
				r := <-ch
				require.NoError(t, r.err)
				require.Equal(t, int64(i), r.m.Offset)
				require.Equal(t, fmt.Sprintf("m%d", i), string(r.m.Body))
			}
			// The reader's tail started when Read(0) waited, at 0 (the
			// writes went through another Store): it holds all three. Offset
			// 0 is gone (MaxMessages 2); the tail must not serve it.
			for off := range int64(3) {
				require.True(t, natsstore.TailHolds(rq, off), "the tail holds offset %d", off)
			}
			_, err := rq.Read(ctx, 0, make([]*ferry.EnhancedMessage, 1))
			require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
			dst := make([]*ferry.EnhancedMessage, 4)
			n, err := rq.Read(ctx, 1, dst)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.Equal(t, "m2", string(dst[1].Body))
			require.NoError(t, rq.Close())
			require.NoError(t, wq.Close())
		})
	}
}
