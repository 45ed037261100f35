package filestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

var activeMeta = ferry.TopicMeta{Name: "a", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}

func activeBody(i int) string { return fmt.Sprintf("m%d-%0*d", i, i%90, 0) }

// openActive opens dir and its queue.
func openActive(t *testing.T, dir string, opts ...Option) (*Store, *queue) {
	t.Helper()
	st, err := Open(dir, opts...)
	require.NoError(t, err)
	fq, err := st.OpenQueue(context.Background(), activeMeta, 0)
	require.NoError(t, err)
	return st, fq.(*queue)
}

// writeActiveMsgs writes messages from to to, one per Write.
func writeActiveMsgs(t *testing.T, q *queue, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		first, err := q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg(activeBody(i))})
		require.NoError(t, err)
		require.Equal(t, int64(i), first)
	}
}

// checkActiveMsgs reads the queue of dir and checks it holds exactly
// messages 0 to n.
func checkActiveMsgs(t *testing.T, q *queue, n int) {
	t.Helper()
	_, next := q.Offsets()
	require.Equal(t, int64(n), next)
	dst := make([]*ferry.EnhancedMessage, 64)
	for off := int64(0); off < next; {
		k, err := q.Read(context.Background(), off, dst)
		require.NoError(t, err)
		for _, m := range dst[:k] {
			require.Equal(t, off, m.Offset)
			require.Equal(t, activeBody(int(off)), string(m.Body))
			off++
		}
	}
}

func logFiles(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "topics", activeMeta.Name, "0", "*.log"))
	require.NoError(t, err)
	slices.Sort(segs)
	return segs
}

func fileFramesEnd(t *testing.T, name string) (size, frames int64) {
	t.Helper()
	f, err := os.Open(name)
	require.NoError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	require.NoError(t, err)
	return fi.Size(), framesEnd(f, fi.Size())
}

// copyDir copies the files of src to dst: what a SIGKILL leaves, since
// the page cache holds what the process wrote through its mapping.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
}

// Without mapping and reserved space (other platforms, or file systems
// without fallocate) every write is a pwrite: segments are exactly as long
// as their frames, roll over and reopen as with mapping.
func TestPwriteActiveSegment(t *testing.T) {
	useMmap = false
	orig := fallocateFile
	fallocateFile = func(f *os.File, _, _ int64) error {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: syscall.EOPNOTSUPP}
	}
	defer func() { useMmap, fallocateFile = mmapSupported, orig }()
	dir := t.TempDir()
	opts := []Option{WithSync(SyncNever), WithSegmentBytes(4 << 10)}
	st, q := openActive(t, dir, opts...)
	writeActiveMsgs(t, q, 0, 300)
	require.Greater(t, len(logFiles(t, dir)), 5)
	checkUnmappedExactAndReopen(t, dir, st, q, 300, opts...)
}

// checkUnmappedExactAndReopen checks that no segment of q is mapped and
// every segment file is exactly as long as its frames, that q holds n
// messages, and that a reopen finds them all with nothing to cut.
func checkUnmappedExactAndReopen(t *testing.T, dir string, st *Store, q *queue, n int, opts ...Option) {
	t.Helper()
	for _, s := range q.segs {
		assert.Nil(t, s.mm)
	}
	for _, name := range logFiles(t, dir) {
		size, frames := fileFramesEnd(t, name)
		assert.Equal(t, frames, size, name)
	}
	checkActiveMsgs(t, q, n)
	require.NoError(t, st.Close())
	st, q = openActive(t, dir, opts...)
	defer st.Close()
	assert.Empty(t, st.Recovery().Truncated)
	checkActiveMsgs(t, q, n)
}

// Writers queued for the writer goroutine when Close runs get ErrClosed,
// none waits forever, and every acknowledged write is kept.
func TestCloseDuringGroupCommit(t *testing.T) {
	dir := t.TempDir()
	opts := []Option{WithSync(SyncAlways), WithSegmentBytes(8 << 10)}
	st, q := openActive(t, dir, opts...)
	var mu sync.Mutex
	acked := map[int64]string{}
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := 0; ; i++ {
				body := fmt.Sprintf("w%d-%d", w, i)
				first, err := q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg(body)})
				if err != nil {
					assert.ErrorIs(t, err, ferry.ErrClosed)
					return
				}
				mu.Lock()
				acked[first] = body
				if len(acked) == 200 {
					once.Do(func() { close(started) })
				}
				mu.Unlock()
			}
		})
	}
	<-started
	require.NoError(t, st.Close())
	wg.Wait()

	st, q = openActive(t, dir, opts...)
	defer st.Close()
	_, next := q.Offsets()
	got := map[int64]string{}
	dst := make([]*ferry.EnhancedMessage, 64)
	for off := int64(0); off < next; {
		k, err := q.Read(context.Background(), off, dst)
		require.NoError(t, err)
		for _, m := range dst[:k] {
			got[m.Offset] = string(m.Body)
			off++
		}
	}
	for off, body := range acked {
		require.Equal(t, body, got[off], "offset %d", off)
	}
}
