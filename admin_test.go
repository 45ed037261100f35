package ferry_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// adminBackends are the brokers the operator API is tried on.
func adminBackends(t *testing.T) map[string]func(t *testing.T) *ferry.Broker {
	return map[string]func(t *testing.T) *ferry.Broker{
		"memory": func(t *testing.T) *ferry.Broker { return newTopic(t, 3) },
		"filestore": func(t *testing.T) *ferry.Broker {
			st, err := filestore.Open(t.TempDir(), filestore.WithSync(filestore.SyncNever))
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, st.Close()) })
			return newTopic(t, 3, ferry.WithStorage(st), ferry.WithCursorStore(st))
		},
	}
}

// Lag is exact at quiescence; Groups lists every group with a cursor.
func TestLagAndGroups(t *testing.T) {
	ctx := context.Background()
	for name, open := range adminBackends(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			produce(t, b, "t", "m", 300, 30)
			tl := newTally(300)
			c := startConsumer(t, b, "done", tl.handler())
			tl.waitAll(t)
			require.Eventually(t, func() bool {
				gl, err := b.Lag(ctx, "done", "t")
				return err == nil && gl.Lag == 0
			}, watchdog, time.Millisecond, "the group that read everything catches up")
			_, err := b.ResetGroup(ctx, "half", "t", ferry.ResetToOffsets(map[int]int64{0: 0}))
			require.NoError(t, err)

			groups, err := b.Groups(ctx, "t")
			require.NoError(t, err)
			require.Len(t, groups, 2)
			assert.Equal(t, "done", groups[0].Group)
			assert.Equal(t, []string{c.MemberID()}, groups[0].Members)
			assert.Zero(t, groups[0].Lag)
			half := groups[1]
			assert.Equal(t, "half", half.Group)
			assert.Empty(t, half.Members)
			var total int64
			for i, q := range half.Queues {
				assert.Equal(t, i, q.Queue.Queue)
				assert.Equal(t, int64(0), q.Oldest)
				if i == 0 {
					assert.Equal(t, int64(0), q.Committed)
				} else {
					assert.Equal(t, int64(-1), q.Committed, "no commit on that queue")
				}
				assert.Equal(t, q.Next, q.Lag)
				total += q.Lag
			}
			assert.Equal(t, int64(300), total)
			assert.Equal(t, total, half.Lag)

			_, err = b.Lag(ctx, "never", "t")
			require.ErrorIs(t, err, ferry.ErrGroupNotFound, "a group without a cursor or a member")
			_, err = b.Lag(ctx, "g", "nope")
			require.ErrorIs(t, err, ferry.ErrTopicNotFound)
			_, err = b.Groups(ctx, "nope")
			require.ErrorIs(t, err, ferry.ErrTopicNotFound)
		})
	}
}

// A cursor store without CursorGroups cannot list groups.
func TestGroupsNeedsCursorGroups(t *testing.T) {
	b := newTopic(t, 1, ferry.WithCursorStore(plainCursors{ferry.NewMemoryCursorStore()}))
	_, err := b.Groups(context.Background(), "t")
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// plainCursors hides every optional interface of the store it wraps.
type plainCursors struct{ s *ferry.MemoryCursorStore }

func (p plainCursors) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	return p.s.Load(ctx, topic, group, queues)
}
func (p plainCursors) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	return p.s.Commit(ctx, topic, group, queue, offset)
}
func (p plainCursors) Close() error { return p.s.Close() }

// ResetGroup moves an idle group's cursors to the earliest, the latest,
// given offsets or a time; it refuses an active group and bad input,
// moving nothing.
func TestResetGroup(t *testing.T) {
	ctx := context.Background()
	for name, open := range adminBackends(t) {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			produce(t, b, "t", "a", 90, 9)
			last := lastStoreTime(t, b)
			waitPast(last.Add(5 * time.Millisecond))
			at := time.Now()
			waitPast(at.Add(5 * time.Millisecond))
			produce(t, b, "t", "b", 90, 9)

			load := func(g string) []int64 {
				offs, err := b.Lag(ctx, g, "t")
				require.NoError(t, err)
				out := make([]int64, len(offs.Queues))
				for i, q := range offs.Queues {
					out[i] = q.Committed
				}
				return out
			}
			nexts := make([]int64, 3)
			for i := range nexts {
				q, err := b.Queue("t", i)
				require.NoError(t, err)
				_, nexts[i] = q.Offsets()
			}
			got, err := b.ResetGroup(ctx, "g", "t", ferry.ResetToLatest())
			require.NoError(t, err)
			assert.Equal(t, nexts, got)
			assert.Equal(t, nexts, load("g"))
			got, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToEarliest())
			require.NoError(t, err)
			assert.Equal(t, []int64{0, 0, 0}, got)

			got, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToTime(at))
			require.NoError(t, err)
			for i, off := range got {
				q, err := b.Queue("t", i)
				require.NoError(t, err)
				dst := make([]*ferry.EnhancedMessage, 1)
				if off < nexts[i] {
					_, err := q.Read(ctx, off, dst)
					require.NoError(t, err)
					assert.Equal(t, byte('b'), dst[0].Body[0], "queue %d: the first message after the time", i)
				}
				if off > 0 {
					_, err := q.Read(ctx, off-1, dst)
					require.NoError(t, err)
					assert.Equal(t, byte('a'), dst[0].Body[0], "queue %d: the message before it is older", i)
				}
			}
			got, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToTime(time.Time{}))
			require.NoError(t, err)
			assert.Equal(t, []int64{0, 0, 0}, got, "a time before everything: the oldest")
			got, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToTime(time.Now().Add(time.Hour)))
			require.NoError(t, err)
			assert.Equal(t, nexts, got, "a time after everything: the next")

			got, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToOffsets(map[int]int64{1: 3}))
			require.NoError(t, err)
			assert.Equal(t, []int64{nexts[0], 3, nexts[2]}, got, "only the queue named moves")

			// Bad input changes nothing.
			before := load("g")
			_, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToOffsets(map[int]int64{0: nexts[0] + 1}))
			require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange, "past the end")
			_, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToOffsets(map[int]int64{7: 0}))
			require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange, "no such queue")
			_, err = b.ResetGroup(ctx, "g", "nope", ferry.ResetToEarliest())
			require.ErrorIs(t, err, ferry.ErrTopicNotFound)
			_, err = b.ResetGroup(ctx, "", "t", ferry.ResetToEarliest())
			require.ErrorIs(t, err, ferry.ErrInvalidOption)
			_, err = b.ResetGroup(ctx, "g", "t", ferry.ResetTo{})
			require.ErrorIs(t, err, ferry.ErrInvalidOption)
			assert.Equal(t, before, load("g"), "refused resets move nothing")
			startConsumer(t, b, "g", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }))
			_, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToEarliest())
			require.ErrorIs(t, err, ferry.ErrGroupActive)
		})
	}
}

// lastStoreTime returns the latest StoreTime in topic t.
func lastStoreTime(t *testing.T, b *ferry.Broker) time.Time {
	var last time.Time
	for i := range 3 {
		q, err := b.Queue("t", i)
		require.NoError(t, err)
		oldest, next := q.Offsets()
		if next == oldest {
			continue
		}
		dst := make([]*ferry.EnhancedMessage, 1)
		_, err = q.Read(context.Background(), next-1, dst)
		require.NoError(t, err)
		if dst[0].StoreTime().After(last) {
			last = dst[0].StoreTime()
		}
	}
	return last
}

// waitPast returns once the clock is past t.
func waitPast(t time.Time) {
	for time.Now().Before(t) {
		time.Sleep(time.Until(t))
	}
}

// Under load, what Lag reports only moves forward: committed and next
// offsets never go back, lag is never negative and never counts more than
// the queue holds.
func TestLagUnderLoadIsConsistent(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 3)
	tl := newTally(3000)
	startConsumer(t, b, "g", tl.handler())
	done := make(chan struct{})
	go func() {
		defer close(done)
		produce(t, b, "t", "m", 3000, 97)
	}()
	prev := make([]ferry.QueueLag, 3)
	for i := range prev {
		prev[i].Committed = -1
	}
	check := func() {
		gl, err := b.Lag(ctx, "g", "t")
		require.NoError(t, err)
		for i, q := range gl.Queues {
			assert.GreaterOrEqual(t, q.Committed, prev[i].Committed, "queue %d committed went back", i)
			assert.GreaterOrEqual(t, q.Next, prev[i].Next, "queue %d next went back", i)
			assert.GreaterOrEqual(t, q.Lag, int64(0))
			assert.LessOrEqual(t, q.Lag, q.Next-q.Oldest)
			prev[i] = q
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			check()
		}
	}
	tl.waitAll(t)
	require.Eventually(t, func() bool {
		gl, err := b.Lag(ctx, "g", "t")
		return err == nil && gl.Lag == 0
	}, watchdog, time.Millisecond, "exact at quiescence")
	check()
}

// Seeking by time on a file queue whose oldest segments retention deleted
// lands on the oldest retained message for a time before it.
func TestResetToTimeAfterRetention(t *testing.T) {
	ctx := context.Background()
	st, err := filestore.Open(t.TempDir(), filestore.WithSync(filestore.SyncNever), filestore.WithSegmentBytes(4<<10))
	require.NoError(t, err)
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 600}}))
	start := time.Now()
	produce(t, b, "t", "m", 2000, 1)
	q, err := b.Queue("t", 0)
	require.NoError(t, err)
	oldest, next := q.Offsets()
	require.Greater(t, oldest, int64(0), "retention deleted the oldest segments")
	got, err := b.ResetGroup(ctx, "g", "t", ferry.ResetToTime(start))
	require.NoError(t, err)
	assert.Equal(t, []int64{oldest}, got, "a time before the oldest retained: the oldest")
	got, err = b.ResetGroup(ctx, "g", "t", ferry.ResetToTime(time.Now().Add(time.Minute)))
	require.NoError(t, err)
	assert.Equal(t, []int64{next}, got)
}
