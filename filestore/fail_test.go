package filestore

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// injectSyncError makes every fsync fail with EIO while on is set.
func injectSyncError(t *testing.T) *atomic.Bool {
	var on atomic.Bool
	orig := syncFile
	syncFile = func(f *os.File) error {
		if on.Load() {
			return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: syscall.EIO}
		}
		return orig(f)
	}
	t.Cleanup(func() { syncFile = orig })
	return &on
}

func testMsg(body string) *ferry.EnhancedMessage {
	return &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: []byte(body)}}
}

func TestFsyncErrorFailsQueue(t *testing.T) {
	ctx := context.Background()
	fail := injectSyncError(t)
	dir := t.TempDir()
	st, err := Open(dir)
	require.NoError(t, err)
	meta := ferry.TopicMeta{Name: "t", Queues: 2}
	q, err := st.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	other, err := st.OpenQueue(ctx, meta, 1)
	require.NoError(t, err)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("kept")})
	require.NoError(t, err)

	fail.Store(true)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("lost")})
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, syscall.EIO)
	fail.Store(false)
	// Fail-stop: no retry even though fsync works again.
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("later")})
	require.ErrorIs(t, err, ErrFailed)
	assert.False(t, errors.Is(err, ferry.ErrClosed))
	_, next := q.Offsets()
	assert.Equal(t, int64(1), next)
	// Reads still work, and other queues are not affected.
	buf := make([]*ferry.EnhancedMessage, 4)
	n, err := q.Read(ctx, 0, buf)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, err = other.Write(ctx, []*ferry.EnhancedMessage{testMsg("fine")})
	require.NoError(t, err)
	require.ErrorIs(t, st.Close(), ErrFailed)

	// Reopening recovers what is on disk: the failed write was cut back.
	st, err = Open(dir)
	require.NoError(t, err)
	defer st.Close()
	q, err = st.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	_, next = q.Offsets()
	assert.Equal(t, int64(1), next)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("again")})
	require.NoError(t, err)
}

func TestFsyncErrorFailsCursors(t *testing.T) {
	ctx := context.Background()
	fail := injectSyncError(t)
	st, err := Open(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, st.Commit(ctx, "t", "g", 0, 1))
	fail.Store(true)
	require.ErrorIs(t, st.Commit(ctx, "t", "g", 0, 2), ErrFailed)
	fail.Store(false)
	require.ErrorIs(t, st.Commit(ctx, "t", "g", 0, 3), ErrFailed)
	require.ErrorIs(t, st.Close(), ErrFailed)
}

func TestWriteErrorFailsQueue(t *testing.T) {
	ctx := context.Background()
	st, err := Open(t.TempDir(), WithSync(SyncNever))
	require.NoError(t, err)
	defer st.Close()
	fq, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	q := fq.(*queue)
	// Pull the file out from under the writer: the next write() fails.
	q.segMu.Lock()
	require.NoError(t, q.segs[len(q.segs)-1].f.Close())
	q.segMu.Unlock()
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("x")})
	require.ErrorIs(t, err, ErrFailed)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("y")})
	require.ErrorIs(t, err, ErrFailed)
}

// SyncEvery's fdatasync runs outside the write lock while writers append
// in their own goroutines; its failure still fails the queue for good.
func TestSyncEveryFsyncErrorFailsQueue(t *testing.T) {
	ctx := context.Background()
	fail := injectSyncError(t)
	// No roll (whose fdatasync would fail the queue too) within the test.
	st, err := Open(t.TempDir(), WithSync(SyncEvery(time.Millisecond)), WithSegmentBytes(1<<30))
	require.NoError(t, err)
	unlimited := ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}
	q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "t", Queues: 1, Retention: unlimited}, 0)
	require.NoError(t, err)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("synced")})
	require.NoError(t, err)

	fail.Store(true)
	// Writes are acknowledged from the page cache until a tick's
	// fdatasync fails; every write after that fails.
	deadline := time.Now().Add(10 * time.Second)
	acked := int64(1)
	for {
		_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("unsynced")})
		if err != nil {
			break
		}
		acked++
		require.True(t, time.Now().Before(deadline), "the failed fdatasync never failed the queue")
	}
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, syscall.EIO)
	fail.Store(false)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("later")})
	require.ErrorIs(t, err, ErrFailed)
	// What was acknowledged stays readable.
	_, next := q.Offsets()
	assert.Equal(t, acked, next)
	n, err := q.Read(ctx, 0, make([]*ferry.EnhancedMessage, 1))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.ErrorIs(t, st.Close(), ErrFailed)
}
