package natsstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestBacklogReader drains a backlog in Reads of 256, as a consumer
// does: after the first Read (a get), the backlog reader serves the
// Reads, every message once, in order, at its offset. A Read a little
// past where the Reads were is served too; a seek back is a get; a
// Read at the end waits for a write and returns it; and a message the
// reader holds that retention has pushed out since is out of range, not
// served.
func TestBacklogReader(t *testing.T) {
	for _, c := range []struct {
		name string
		cl   func(testing.TB) *cluster
	}{{"Single", singleServer}, {"Cluster", tripleServer}} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "Cluster" && testing.Short() {
				t.Skip("-short: no cluster")
			}
			ctx := t.Context()
			prefix := fmt.Sprintf("bl%d", fresh.Add(1))
			st := openStore(t, c.cl(t), prefix)
			defer st.Close()
			const keep = 3000
			meta := ferry.TopicMeta{Name: "orders", Queues: 1, Retention: ferry.Retention{MaxMessages: keep, MaxBytes: ferry.Unlimited}}
			q, err := st.OpenQueue(ctx, meta, 0)
			require.NoError(t, err)
			defer q.Close()
			write := func(from, n int) {
				for i := 0; i < n; i += 100 {
					msgs := newMsgs("orders", 100)
					for j, m := range msgs {
						m.Body = fmt.Appendf(nil, "m-%d", from+i+j)
					}
					_, err := q.Write(ctx, msgs)
					require.NoError(t, err)
				}
			}
			write(0, keep)
			dst := make([]*ferry.EnhancedMessage, 256)
			check := func(off int64, n int) {
				for i, m := range dst[:n] {
					require.Equal(t, off+int64(i), m.Offset)
					require.Equal(t, fmt.Sprintf("m-%d", off+int64(i)), string(m.Body))
				}
			}
			off := int64(0)
			for off < keep/2 {
				n, err := q.Read(ctx, off, dst)
				require.NoError(t, err)
				require.Positive(t, n)
				check(off, n)
				off += int64(n)
			}
			require.Positive(t, natsstore.BacklogServed(q), "the backlog reader served Reads")
			off += 7 // a little past: the reader drops what it holds below
			n, err := q.Read(ctx, off, dst)
			require.NoError(t, err)
			check(off, n)
			n, err = q.Read(ctx, 10, dst) // a seek back
			require.NoError(t, err)
			check(10, n)
			for off = 10 + int64(n); off < keep; {
				n, err := q.Read(ctx, off, dst)
				require.NoError(t, err)
				check(off, n)
				off += int64(n)
			}
			got := make(chan error, 1)
			go func() {
				n, err := q.Read(ctx, keep, dst)
				if err == nil && (n < 1 || string(dst[0].Body) != fmt.Sprintf("m-%d", keep)) {
					err = fmt.Errorf("read %d at the end", n)
				}
				got <- err
			}()
			write(keep, 100) // the first of these wakes the Read at the end
			select {
			case err := <-got:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("a Read at the end was not woken by a write")
			}

			// A retention cut under what the reader holds.
			write(keep+100, keep-100) // offsets keep .. 2 keep−1 held
			n, err = q.Read(ctx, keep, dst)
			require.NoError(t, err)
			require.Equal(t, 256, n)
			n, err = q.Read(ctx, keep+256, dst) // the reader runs from here
			require.NoError(t, err)
			check(keep+256, n)
			write(2*keep, 1000) // pushes keep .. keep+999 out
			_, err = q.Read(ctx, keep+256+int64(n), dst)
			require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange, "a Read of an offset pushed out since the reader was pushed it")
			require.NoError(t, q.Close())
		})
	}
}
