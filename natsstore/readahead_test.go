package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestReadAhead drains a backlog in Reads of 256, as a consumer does:
// the Reads after the first are served what the queue got ahead, every
// message once, in order, at its offset. Then a read-ahead overtaken by
// the queue's retention is not served: a Read of an offset pushed out
// is out of range, as a get says.
func TestReadAhead(t *testing.T) {
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("ra%d", fresh.Add(1))
	st := openStore(t, c, prefix)
	defer st.Close()
	const keep = 2000
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
	for off := int64(0); off < keep; {
		n, err := q.Read(ctx, off, dst)
		require.NoError(t, err)
		require.Positive(t, n)
		for _, m := range dst[:n] {
			require.Equal(t, off, m.Offset)
			require.Equal(t, fmt.Sprintf("m-%d", off), string(m.Body))
			off++
		}
	}

	write(keep, keep) // the next keep
	n, err := q.Read(ctx, keep, dst)
	require.NoError(t, err)
	require.Equal(t, 256, n) // a full batch: the queue reads ahead from keep+256
	write(2*keep, 512)       // pushes keep .. keep+511 out
	_, err = q.Read(ctx, keep+256, dst)
	require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange, "a Read of an offset pushed out since the queue read ahead")
}
