package filestore_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
)

func open(t *testing.T, dir string, opts ...filestore.Option) *filestore.Store {
	t.Helper()
	st, err := filestore.Open(dir, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func msg(topic string, i int) *ferry.EnhancedMessage {
	return &ferry.EnhancedMessage{Message: ferry.Message{
		Topic: topic, Key: fmt.Sprint("k", i), Headers: map[string]string{"i": fmt.Sprint(i)},
		Body: fmt.Appendf(nil, "body %d", i),
	}}
}

func openQueue(t *testing.T, st *filestore.Store, meta ferry.TopicMeta, i int) ferry.Queue {
	t.Helper()
	q, err := st.OpenQueue(context.Background(), meta, i)
	require.NoError(t, err)
	return q
}

func readAll(t *testing.T, q ferry.ReadableQueue, from int64) []*ferry.EnhancedMessage {
	t.Helper()
	_, next := q.Offsets()
	var out []*ferry.EnhancedMessage
	for off := from; off < next; {
		dst := make([]*ferry.EnhancedMessage, 7)
		n, err := q.Read(context.Background(), off, dst)
		require.NoError(t, err)
		require.Positive(t, n)
		out = append(out, dst[:n]...)
		off += int64(n)
	}
	return out
}

func TestWriteReadReopen(t *testing.T) {
	ctx := context.Background()
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncEvery(time.Millisecond), filestore.SyncNever} {
		t.Run(p.String(), func(t *testing.T) {
			dir := t.TempDir()
			meta := ferry.TopicMeta{Name: "orders", Queues: 2}
			// Small segments and cache so reads go to disk across segments.
			opts := []filestore.Option{filestore.WithSync(p), filestore.WithSegmentBytes(4096), filestore.WithCache(5, 1<<20)}
			st := open(t, dir, opts...)
			require.NoError(t, st.SaveTopic(ctx, meta))
			q := openQueue(t, st, meta, 1)
			var want []*ferry.EnhancedMessage
			for i := range 200 {
				batch := []*ferry.EnhancedMessage{msg("orders", 2*i), msg("orders", 2*i+1)}
				first, err := q.Write(ctx, batch)
				require.NoError(t, err)
				require.Equal(t, int64(2*i), first)
				assert.Equal(t, 1, batch[1].Queue)
				assert.Equal(t, int64(2*i+1), batch[1].Offset)
				assert.False(t, batch[1].StoreTime().IsZero())
				want = append(want, batch...)
			}
			first, err := q.Write(ctx, nil)
			require.NoError(t, err)
			assert.Equal(t, int64(400), first)
			got := readAll(t, q, 0)
			require.Len(t, got, 400)
			for i, m := range got {
				assertSame(t, want[i], m)
			}
			require.NoError(t, st.Close())
			_, err = q.Write(ctx, []*ferry.EnhancedMessage{msg("orders", 0)})
			require.ErrorIs(t, err, ferry.ErrClosed)

			st = open(t, dir, opts...)
			assert.Empty(t, st.Recovery().Truncated)
			topics, err := st.Topics(ctx)
			require.NoError(t, err)
			assert.Equal(t, []ferry.TopicMeta{meta.Normalized()}, topics)
			q = openQueue(t, st, meta, 1)
			oldest, next := q.Offsets()
			assert.Equal(t, int64(0), oldest)
			assert.Equal(t, int64(400), next)
			got = readAll(t, q, 0)
			require.Len(t, got, 400)
			for i, m := range got {
				assertSame(t, want[i], m)
			}
			first, err = q.Write(ctx, []*ferry.EnhancedMessage{msg("orders", 400)})
			require.NoError(t, err)
			assert.Equal(t, int64(400), first)
			q0 := openQueue(t, st, meta, 0)
			_, next = q0.Offsets()
			assert.Equal(t, int64(0), next)
		})
	}
}

func assertSame(t *testing.T, want, got *ferry.EnhancedMessage) {
	t.Helper()
	assert.Equal(t, want.Offset, got.Offset)
	assert.Equal(t, want.Topic, got.Topic)
	assert.Equal(t, want.Key, got.Key)
	assert.Equal(t, want.Headers, got.Headers)
	assert.Equal(t, want.Body, got.Body)
	assert.True(t, want.StoreTime().Equal(got.StoreTime()))
	assert.Equal(t, want.Queue, got.Queue)
}

func TestReadBlocksUntilWrite(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir())
	meta := ferry.TopicMeta{Name: "t", Queues: 1}
	q := openQueue(t, st, meta, 0)
	got := make(chan int64, 1)
	go func() {
		dst := make([]*ferry.EnhancedMessage, 4)
		n, err := q.Read(ctx, 0, dst)
		if err != nil || n < 1 {
			got <- -1
			return
		}
		got <- dst[0].Offset
	}()
	_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", 0)})
	require.NoError(t, err)
	assert.Equal(t, int64(0), <-got)

	// Cancelled and closed.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = q.Read(cctx, 1, make([]*ferry.EnhancedMessage, 1))
	require.ErrorIs(t, err, context.Canceled)
	_, err = q.Read(ctx, 2, make([]*ferry.EnhancedMessage, 1))
	require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
	done := make(chan error, 1)
	go func() {
		_, err := q.Read(ctx, 1, make([]*ferry.EnhancedMessage, 1))
		done <- err
	}()
	require.NoError(t, q.Close())
	require.ErrorIs(t, <-done, ferry.ErrClosed)
	require.NoError(t, q.Close())
	_, err = q.Read(ctx, 0, make([]*ferry.EnhancedMessage, 1))
	require.ErrorIs(t, err, ferry.ErrClosed)
	// Reopening a closed queue recovers it from disk.
	q = openQueue(t, st, meta, 0)
	_, next := q.Offsets()
	assert.Equal(t, int64(1), next)
}

func TestWriteRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir(), filestore.WithMaxFrameBytes(8<<10))
	q := openQueue(t, st, ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 3}}, 0)
	_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", 0), nil})
	require.ErrorIs(t, err, ferry.ErrInvalidMessage)
	big := msg("t", 1)
	big.Body = make([]byte, 9<<10)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{big})
	require.ErrorIs(t, err, ferry.ErrMessageTooLarge)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{msg("t", 0), msg("t", 1), msg("t", 2), msg("t", 3)})
	require.ErrorIs(t, err, ferry.ErrMessageTooLarge)
	_, next := q.Offsets()
	assert.Equal(t, int64(0), next, "nothing written")

	_, err = st.OpenQueue(ctx, ferry.TopicMeta{Name: "../x", Queues: 1}, 0)
	require.ErrorIs(t, err, ferry.ErrInvalidTopic)
	_, err = st.OpenQueue(ctx, ferry.TopicMeta{Name: "t", Queues: 1}, 1)
	require.ErrorIs(t, err, ferry.ErrInvalidTopic)
	require.ErrorIs(t, st.SaveTopic(ctx, ferry.TopicMeta{Name: "a/b", Queues: 1}), ferry.ErrInvalidTopic)
	require.ErrorIs(t, st.SaveTopic(ctx, ferry.TopicMeta{Name: "..", Queues: 1}), ferry.ErrInvalidTopic)

	_, err = filestore.Open(t.TempDir(), filestore.WithSegmentBytes(1))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = filestore.Open(t.TempDir(), filestore.WithSync(filestore.SyncEvery(0)))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

func TestConcurrentWritersGroupCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := open(t, dir, filestore.WithSegmentBytes(16<<10))
	meta := ferry.TopicMeta{Name: "t", Queues: 1}
	q := openQueue(t, st, meta, 0)
	const writers, each = 16, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", w*1000+i)})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.NoError(t, st.Close())
	st = open(t, dir)
	q = openQueue(t, st, meta, 0)
	got := readAll(t, q, 0)
	require.Len(t, got, writers*each)
	seen := map[string]bool{}
	for i, m := range got {
		require.Equal(t, int64(i), m.Offset)
		seen[m.Key] = true
	}
	assert.Len(t, seen, writers*each)
}

func TestRetention(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := open(t, dir)
	meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 10}}
	q := openQueue(t, st, meta, 0)
	for i := range 25 {
		_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", i)})
		require.NoError(t, err)
	}
	oldest, next := q.Offsets()
	assert.Equal(t, int64(15), oldest, "bounds of 15 or fewer messages are exact")
	assert.Equal(t, int64(25), next)
	_, err := q.Read(ctx, 14, make([]*ferry.EnhancedMessage, 1))
	require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
	got := readAll(t, q, 15)
	require.Len(t, got, 10)

	// Larger bounds: at least the bound, at most an eighth more.
	meta2 := ferry.TopicMeta{Name: "u", Queues: 1, Retention: ferry.Retention{MaxMessages: 800, MaxBytes: ferry.Unlimited}}
	q2 := openQueue(t, st, meta2, 0)
	for i := range 100 {
		batch := make([]*ferry.EnhancedMessage, 20)
		for j := range batch {
			batch[j] = msg("u", i*20+j)
		}
		_, err := q2.Write(ctx, batch)
		require.NoError(t, err)
	}
	oldest, next = q2.Offsets()
	assert.Equal(t, int64(2000), next)
	assert.GreaterOrEqual(t, next-oldest, int64(800))
	assert.LessOrEqual(t, next-oldest, int64(900))
	require.NoError(t, st.Close())

	// Retention holds across reopen, and files of deleted segments are gone.
	st = open(t, dir)
	q2 = openQueue(t, st, meta2, 0)
	o2, n2 := q2.Offsets()
	assert.Equal(t, oldest, o2)
	assert.Equal(t, next, n2)
	logs, _ := filepath.Glob(filepath.Join(dir, "topics", "u", "0", "*.log"))
	assert.LessOrEqual(t, len(logs), 9)
}

func TestRetentionBytesAndAge(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir())
	// Each message has Size 10; 100 bytes keep 10 messages.
	mk := func(i int) *ferry.EnhancedMessage {
		return &ferry.EnhancedMessage{Message: ferry.Message{Topic: "b", Body: fmt.Appendf(nil, "%010d", i)}}
	}
	q := openQueue(t, st, ferry.TopicMeta{Name: "b", Queues: 1, Retention: ferry.Retention{MaxBytes: 100}}, 0)
	for i := range 30 {
		_, err := q.Write(ctx, []*ferry.EnhancedMessage{mk(i)})
		require.NoError(t, err)
	}
	oldest, next := q.Offsets()
	assert.Equal(t, int64(30), next)
	assert.Equal(t, int64(20), oldest)

	const age = 50 * time.Millisecond
	qa := openQueue(t, st, ferry.TopicMeta{Name: "a", Queues: 1, Retention: ferry.Retention{MaxAge: age}}, 0)
	_, err := qa.Write(ctx, []*ferry.EnhancedMessage{mk(0), mk(1)})
	require.NoError(t, err)
	// Wait, by reading, until the messages expire: a read at 0 then
	// fails with ErrOffsetOutOfRange, without any write.
	deadline := time.Now().Add(10 * time.Second)
	for {
		oldest, next := qa.Offsets()
		if oldest == 2 && next == 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "messages never expired")
		dst := make([]*ferry.EnhancedMessage, 1)
		rctx, cancel := context.WithTimeout(ctx, age)
		_, _ = qa.Read(rctx, 2, dst) // blocks for age: nothing is written
		cancel()
	}
	_, err = qa.Read(ctx, 0, make([]*ferry.EnhancedMessage, 1))
	require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
}

func TestBlockOverflow(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir())
	meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 4, Overflow: ferry.Block}}
	q := openQueue(t, st, meta, 0)
	tw := q.(ferry.TryWriter)
	rel := q.(ferry.Releaser)
	for i := range 4 {
		_, err := tw.TryWrite([]*ferry.EnhancedMessage{msg("t", i)})
		require.NoError(t, err)
	}
	_, err := tw.TryWrite([]*ferry.EnhancedMessage{msg("t", 4)})
	require.ErrorIs(t, err, ferry.ErrQueueFull)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = q.Write(cctx, []*ferry.EnhancedMessage{msg("t", 4)})
	require.ErrorIs(t, err, context.Canceled)

	done := make(chan int64, 1)
	go func() {
		first, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", 4), msg("t", 5)})
		if err != nil {
			first = -1
		}
		done <- first
	}()
	rel.Release(2)
	assert.Equal(t, int64(4), <-done)
	oldest, next := q.Offsets()
	assert.Equal(t, int64(2), oldest)
	assert.Equal(t, int64(6), next)
	got := readAll(t, q, 2)
	require.Len(t, got, 4)
}

func TestExclusiveOpen(t *testing.T) {
	dir := t.TempDir()
	st := open(t, dir)
	_, err := filestore.Open(dir)
	require.ErrorIs(t, err, filestore.ErrLocked)

	// Another process.
	out, err := exec.Command(os.Args[0], "-test.run=^$").CombinedOutput()
	_ = out
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "locked: true")

	require.NoError(t, st.Close())
	require.NoError(t, st.Close())
	st2 := open(t, dir)
	require.NoError(t, st2.Close())
}

const lockChildEnv = "FILESTORE_LOCK_CHILD"

func lockChild() {
	_, err := filestore.Open(os.Getenv(lockChildEnv))
	fmt.Printf("locked: %v (%v)\n", errors.Is(err, filestore.ErrLocked), err)
}

func TestPermissionsAndLayout(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	st := open(t, dir, filestore.WithSegmentBytes(4096))
	meta := ferry.TopicMeta{Name: "a.b-c_d%e", Queues: 1}
	require.NoError(t, st.SaveTopic(ctx, meta))
	q := openQueue(t, st, meta, 0)
	for i := range 100 {
		_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg(meta.Name, i)})
		require.NoError(t, err)
	}
	require.NoError(t, st.Commit(ctx, meta.Name, "g", 0, 3))
	require.NoError(t, st.Close())
	var files, dirs int
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		if d.IsDir() {
			dirs++
			assert.Equal(t, fs.FileMode(0o700), info.Mode().Perm(), p)
		} else {
			files++
			assert.Equal(t, fs.FileMode(0o600), info.Mode().Perm(), p)
		}
		return nil
	}))
	assert.Equal(t, 4, dirs) // store, topics, topic, queue
	segs, _ := filepath.Glob(filepath.Join(dir, "topics", meta.Name, "0", "*.log"))
	idxs, _ := filepath.Glob(filepath.Join(dir, "topics", meta.Name, "0", "*.index"))
	assert.Greater(t, len(segs), 1)
	assert.Len(t, idxs, len(segs)-1, "every sealed segment has an index")
	assert.Equal(t, "00000000000000000000.log", filepath.Base(segs[0]))
}

func TestCursorsPersistAndClamp(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := open(t, dir)
	meta := ferry.TopicMeta{Name: "t", Queues: 2, Retention: ferry.Retention{MaxMessages: 5}}
	require.NoError(t, st.SaveTopic(ctx, meta))
	q := openQueue(t, st, meta, 0)
	for i := range 4 {
		_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", i)})
		require.NoError(t, err)
	}
	require.NoError(t, st.Commit(ctx, "t", "early", 0, 1))
	require.NoError(t, st.Commit(ctx, "t", "late", 0, 4))
	require.NoError(t, st.Commit(ctx, "t", "late", 1, 0))
	require.NoError(t, st.Commit(ctx, "other", "g g/../x\xff\x00", 3, 42)) // no such queue: kept as is
	got, err := st.Load(ctx, "t", "late", 3)
	require.NoError(t, err)
	assert.Equal(t, []int64{4, 0, -1}, got)
	require.ErrorIs(t, st.Commit(ctx, "t", "g", 0, -1), ferry.ErrOffsetOutOfRange)
	require.ErrorIs(t, st.Commit(ctx, "../t", "g", 0, 1), ferry.ErrInvalidTopic)
	_, err = st.Load(ctx, "t", "", 1)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	// Retention moves queue 0 on past the early group's cursor.
	for i := 4; i < 10; i++ {
		_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", i)})
		require.NoError(t, err)
	}
	require.NoError(t, st.Close())
	_, err = st.Load(ctx, "t", "late", 1)
	require.ErrorIs(t, err, ferry.ErrClosed)
	require.ErrorIs(t, st.Commit(ctx, "t", "late", 0, 1), ferry.ErrClosed)

	st = open(t, dir)
	got, err = st.Load(ctx, "t", "early", 2)
	require.NoError(t, err)
	assert.Equal(t, []int64{5, -1}, got, "clamped to the oldest retained offset")
	assert.Equal(t, []filestore.ClampedCursor{
		{Topic: "t", Group: "early", Queue: 0, From: 1, To: 5},
		{Topic: "t", Group: "late", Queue: 0, From: 4, To: 5},
	}, st.Recovery().ClampedCursors)
	got, err = st.Load(ctx, "t", "late", 2)
	require.NoError(t, err)
	assert.Equal(t, []int64{5, 0}, got)
	got, err = st.Load(ctx, "other", "g g/../x\xff\x00", 4)
	require.NoError(t, err)
	assert.Equal(t, []int64{-1, -1, -1, 42}, got)
}

func TestBrokerOverStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := open(t, dir)
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 3}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	sent := map[ferry.QueueID][]string{}
	for i := range 30 {
		res, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: fmt.Sprint(i % 7), Body: fmt.Appendf(nil, "m%d", i)})
		require.NoError(t, err)
		sent[res.Queue] = append(sent[res.Queue], fmt.Sprintf("m%d", i))
	}
	require.NoError(t, p.Close())
	require.NoError(t, b.Close())
	require.NoError(t, st.Close())

	st = open(t, dir)
	b, err = ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	defer b.Close()
	meta, ok := b.Topic("orders")
	require.True(t, ok)
	assert.Equal(t, 3, meta.Queues)
	total := 0
	for i := range 3 {
		q, err := b.Queue("orders", i)
		require.NoError(t, err)
		var bodies []string
		for _, m := range readAll(t, q, 0) {
			bodies = append(bodies, string(m.Body))
		}
		assert.Equal(t, sent[ferry.QueueID{Topic: "orders", Queue: i}], bodies)
		total += len(bodies)
	}
	assert.Equal(t, 30, total)
}

func TestTailingReadersWithRetention(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir(), filestore.WithSegmentBytes(4096), filestore.WithCache(8, 1<<20), filestore.WithSync(filestore.SyncNever))
	meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 400}}
	q := openQueue(t, st, meta, 0)
	const writers, each = 4, 300
	total := int64(writers * each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", w*each+i)})
				assert.NoError(t, err)
			}
		})
	}
	for range 3 {
		wg.Go(func() {
			off, prev := int64(0), int64(-1)
			dst := make([]*ferry.EnhancedMessage, 16)
			for off < total {
				n, err := q.Read(ctx, off, dst)
				if errors.Is(err, ferry.ErrOffsetOutOfRange) {
					oldest, _ := q.Offsets()
					assert.Greater(t, oldest, off, "out of range only below the oldest")
					off = oldest
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				for _, m := range dst[:n] {
					assert.Greater(t, m.Offset, prev)
					assert.Equal(t, off, m.Offset)
					prev = m.Offset
					off++
				}
			}
		})
	}
	wg.Wait()
	oldest, next := q.Offsets()
	assert.Equal(t, total, next)
	assert.GreaterOrEqual(t, next-oldest, int64(400))
	assert.LessOrEqual(t, next-oldest, int64(450))
}

func TestBatchSpansFramesAndSegments(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := []filestore.Option{filestore.WithSegmentBytes(4096), filestore.WithMaxFrameBytes(4096), filestore.WithCache(0, 0)}
	st := open(t, dir, opts...)
	meta := ferry.TopicMeta{Name: "t", Queues: 1}
	q := openQueue(t, st, meta, 0)
	batch := make([]*ferry.EnhancedMessage, 100)
	for i := range batch {
		batch[i] = msg("t", i)
		batch[i].Body = make([]byte, 200)
		batch[i].Body[0] = byte(i)
	}
	first, err := q.Write(ctx, batch)
	require.NoError(t, err)
	assert.Equal(t, int64(0), first)
	require.NoError(t, st.Close())
	segs, _ := filepath.Glob(filepath.Join(dir, "topics", "t", "0", "*.log"))
	assert.Greater(t, len(segs), 4, "a 20 KB batch over 4 KiB segments")

	st = open(t, dir, opts...)
	q = openQueue(t, st, meta, 0)
	got := readAll(t, q, 0)
	require.Len(t, got, 100)
	for i, m := range got {
		assert.Equal(t, byte(i), m.Body[0])
	}
	// Reads from the middle of a segment go through the sparse index.
	dst := make([]*ferry.EnhancedMessage, 3)
	n, err := q.Read(ctx, 57, dst)
	require.NoError(t, err)
	require.Positive(t, n)
	assert.Equal(t, int64(57), dst[0].Offset)
}

func TestOpenQueueTwiceSharesTheQueue(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir())
	meta := ferry.TopicMeta{Name: "t", Queues: 1}
	a := openQueue(t, st, meta, 0)
	b := openQueue(t, st, meta, 0)
	_, err := a.Write(ctx, []*ferry.EnhancedMessage{msg("t", 0)})
	require.NoError(t, err)
	_, next := b.Offsets()
	assert.Equal(t, int64(1), next)
	require.NoError(t, st.Close())
	_, err = st.OpenQueue(ctx, meta, 0)
	require.ErrorIs(t, err, ferry.ErrClosed)
	_, err = st.Topics(ctx)
	require.ErrorIs(t, err, ferry.ErrClosed)
	require.ErrorIs(t, st.SaveTopic(ctx, meta), ferry.ErrClosed)
}

func TestNothingEscapesTheDirectory(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	outside := t.TempDir()
	st := open(t, dir)
	require.NoError(t, st.Close())
	// A topic folder that is a symlink to elsewhere is not followed out.
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "topics", "evil")))
	st = open(t, dir)
	topics, err := st.Topics(ctx)
	require.NoError(t, err)
	assert.Empty(t, topics)
	_, err = st.OpenQueue(ctx, ferry.TopicMeta{Name: "evil", Queues: 1}, 0)
	require.Error(t, err)
	require.Error(t, st.SaveTopic(ctx, ferry.TopicMeta{Name: "evil", Queues: 1}))
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written outside the store's directory")
	// Names that are paths never reach the file system.
	for _, name := range []string{"..", ".", "../x", "a/b", "/abs", "a\x00b", ""} {
		_, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: name, Queues: 1}, 0)
		require.ErrorIs(t, err, ferry.ErrInvalidTopic, "%q", name)
	}
}

func TestBlockHoldsExpiredUntilReleased(t *testing.T) {
	ctx := context.Background()
	st := open(t, t.TempDir())
	const age = 20 * time.Millisecond
	meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxAge: age, Overflow: ferry.Block}}
	q := openQueue(t, st, meta, 0)
	_, err := q.Write(ctx, []*ferry.EnhancedMessage{msg("t", 0), msg("t", 1)})
	require.NoError(t, err)
	// Let the messages age: a read at the end times out after age.
	rctx, cancel := context.WithTimeout(ctx, 2*age)
	_, err = q.Read(rctx, 2, make([]*ferry.EnhancedMessage, 1))
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	oldest, next := q.Offsets()
	assert.Equal(t, int64(0), oldest, "Block keeps what is not released, however old")
	assert.Equal(t, int64(2), next)
	q.(ferry.Releaser).Release(2)
	oldest, next = q.Offsets()
	assert.Equal(t, int64(2), oldest, "released and expired: gone")
	assert.Equal(t, int64(2), next)
}

// TestBlockDropsReleasedSegments: a Block queue with no bound drops its
// sealed segments once they are wholly released, without waiting for a
// write to need their room, which it never does (it would keep every
// message it ever held: Ferry's delay levels are such queues).
func TestBlockDropsReleasedSegments(t *testing.T) {
	st := open(t, t.TempDir(), filestore.WithSegmentBytes(4096)) // about 100 messages a segment
	meta := ferry.TopicMeta{Name: "b", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited, Overflow: ferry.Block}}
	require.NoError(t, st.CreateTopic(context.Background(), meta))
	q := openQueue(t, st, meta, 0)
	for i := range 500 {
		_, err := q.Write(context.Background(), []*ferry.EnhancedMessage{msg("b", i)})
		require.NoError(t, err)
	}
	q.(ferry.Releaser).Release(400)
	ferrytest.WaitFor(t, 10*time.Second, "released segments dropped", func() bool {
		oldest, _ := q.Offsets()
		return oldest >= 300
	}, nil)
	oldest, next := q.Offsets()
	assert.LessOrEqual(t, oldest, int64(400), "nothing unreleased dropped")
	assert.Equal(t, int64(500), next)
	got := readAll(t, q, 400)
	assert.Len(t, got, 100)
}
