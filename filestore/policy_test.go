package filestore

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// countSyncs counts fsyncs of segment files, and calls each on every one.
func countSyncs(t *testing.T, each func()) *atomic.Int64 {
	var n atomic.Int64
	orig := syncFile
	syncFile = func(f *os.File) error {
		if strings.HasSuffix(f.Name(), ".log") {
			n.Add(1)
			if each != nil {
				each()
			}
		}
		return orig(f)
	}
	t.Cleanup(func() { syncFile = orig })
	return &n
}

func TestSyncAlwaysSyncsBeforeAck(t *testing.T) {
	syncs := countSyncs(t, nil)
	st, err := Open(t.TempDir(), WithSync(SyncAlways))
	require.NoError(t, err)
	defer st.Close()
	q, err := st.OpenQueue(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	for i := range 5 {
		_, err := q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg("x")})
		require.NoError(t, err)
		assert.Equal(t, int64(i+1), syncs.Load(), "one fdatasync per lone write, before it returns")
	}
}

func TestSyncEverySyncsLater(t *testing.T) {
	synced := make(chan struct{}, 100)
	countSyncs(t, func() { synced <- struct{}{} })
	st, err := Open(t.TempDir(), WithSync(SyncEvery(time.Millisecond)))
	require.NoError(t, err)
	defer st.Close()
	q, err := st.OpenQueue(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	_, err = q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg("x")})
	require.NoError(t, err)
	<-synced // the interval flushes the unsynced bytes
}

func TestSyncNeverNeverSyncsSegments(t *testing.T) {
	syncs := countSyncs(t, nil)
	dir := t.TempDir()
	st, err := Open(dir, WithSync(SyncNever), WithSegmentBytes(4096))
	require.NoError(t, err)
	q, err := st.OpenQueue(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	for range 200 { // several rolls
		_, err := q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg(strings.Repeat("x", 100))})
		require.NoError(t, err)
	}
	require.NoError(t, st.Close())
	assert.Zero(t, syncs.Load())
}

func TestGroupCommitSharesSyncs(t *testing.T) {
	release := make(chan struct{})
	var first sync.Once
	firstSync := make(chan struct{})
	syncs := countSyncs(t, func() {
		first.Do(func() { close(firstSync) })
		<-release
	})
	st, err := Open(t.TempDir(), WithSync(SyncAlways))
	require.NoError(t, err)
	defer st.Close()
	q, err := st.OpenQueue(context.Background(), ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	require.NoError(t, err)
	const writers = 64
	var wg sync.WaitGroup
	var started sync.WaitGroup
	started.Add(writers)
	for range writers {
		wg.Go(func() {
			started.Done()
			_, err := q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg("x")})
			assert.NoError(t, err)
		})
	}
	<-firstSync    // the first write holds the writer in fdatasync
	started.Wait() // meanwhile the others queue up
	close(release)
	wg.Wait()
	_, next := q.Offsets()
	assert.Equal(t, int64(writers), next)
	assert.Less(t, syncs.Load(), int64(writers), "concurrent writers share fdatasyncs")
	t.Logf("%d writes, %d fdatasyncs", writers, syncs.Load())
}

// The policies are constants, so no package can change what they mean;
// the zero SyncPolicy and SyncEvery of a non-positive interval are
// refused.
func TestSyncPoliciesAreConstants(t *testing.T) {
	const always, never = SyncAlways, SyncNever // compiles only for constants
	assert.Equal(t, "SyncAlways", always.String())
	assert.Equal(t, "SyncNever", never.String())
	assert.Equal(t, "SyncEvery(5ms)", SyncEvery(5*time.Millisecond).String())
	for _, p := range []SyncPolicy{0, SyncEvery(0), SyncEvery(-time.Second)} {
		_, err := Open(t.TempDir(), WithSync(p))
		require.ErrorIs(t, err, ferry.ErrInvalidOption, "%v", p)
	}
}

// A store's errors keep one "ferry:" prefix per chain.
func TestErrorsHaveOnePrefix(t *testing.T) {
	st, err := Open(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, st.Close())
	_, err = st.Load(context.Background(), "t", "g", 1)
	require.ErrorIs(t, err, ferry.ErrClosed)
	assert.Equal(t, 1, strings.Count(err.Error(), "ferry:"), err.Error())
	_, err = Open(t.TempDir(), WithSync(0))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	assert.Equal(t, 1, strings.Count(err.Error(), "ferry:"), err.Error())
}
