package filestore

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// A store killed with space reserved in its active segment (mapped but
// under SyncAlways) leaves a file longer than its frames, zeros after
// them; Open cuts it to exactly the acknowledged frames, and the queue
// takes writes again.
func TestMappedTailAfterCrash(t *testing.T) {
	for _, p := range []SyncPolicy{SyncNever, SyncAlways} {
		t.Run(p.String(), func(t *testing.T) { testMappedTailAfterCrash(t, p) })
	}
}

func testMappedTailAfterCrash(t *testing.T, p SyncPolicy) {
	dir := t.TempDir()
	opts := []Option{WithSync(p), WithSegmentBytes(1 << 20)}
	st, q := openActive(t, dir, opts...)
	defer st.Close()
	writeActiveMsgs(t, q, 0, 500)
	require.Equal(t, p != SyncAlways, q.segs[0].mm != nil, "the active segment is mapped")
	segs := logFiles(t, dir)
	require.Len(t, segs, 1)
	size, frames := fileFramesEnd(t, segs[0])
	require.Greater(t, size, frames, "space is reserved after the frames")

	crashed := t.TempDir()
	copyDir(t, dir, crashed)
	st2, q2 := openActive(t, crashed, opts...)
	checkActiveMsgs(t, q2, 500)
	tr := st2.Recovery().Truncated
	require.Len(t, tr, 1)
	assert.Equal(t, frames, tr[0].At)
	assert.Equal(t, size-frames, tr[0].Cut)
	writeActiveMsgs(t, q2, 500, 600)
	require.NoError(t, st2.Close())
	size, frames = fileFramesEnd(t, logFiles(t, crashed)[0])
	assert.Equal(t, frames, size, "Close cuts the reserved space")

	st2, q2 = openActive(t, crashed, opts...)
	defer st2.Close()
	checkActiveMsgs(t, q2, 600)
	assert.Empty(t, st2.Recovery().Truncated)
}

// Space is reserved in steps that double from minReserve, never beyond
// the segment size, and always ahead of the frames.
func TestMappedReserveGrows(t *testing.T) {
	dir := t.TempDir()
	st, q := openActive(t, dir, WithSync(SyncNever), WithSegmentBytes(1<<20))
	defer st.Close()
	var sizes []int64
	for i := range 8000 {
		writeActiveMsgs(t, q, i, i+1)
		q.segMu.RLock()
		act := q.segs[len(q.segs)-1]
		name, frames := act.name, act.size
		q.segMu.RUnlock()
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		size := fi.Size()
		require.GreaterOrEqual(t, size, frames)
		if len(sizes) == 0 || sizes[len(sizes)-1] != size {
			sizes = append(sizes, size)
		}
	}
	require.Greater(t, len(logFiles(t, dir)), 1, "the test rolls")
	// The first segment grew 64K, 128K, ... 1M, then the next started.
	assert.Equal(t, []int64{64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20}, sizes[:5])
	assert.Equal(t, int64(64<<10), sizes[5])
}

// Rolling over seals the mapped segment: unmapped, cut to its frames,
// indexed; only the active segment is mapped, and none under SyncAlways.
func TestMappedRollOver(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []SyncPolicy{SyncNever, SyncEvery(time.Millisecond), SyncAlways} {
		t.Run(p.String(), func(t *testing.T) {
			dir := filepath.Join(dir, p.String())
			opts := []Option{WithSync(p), WithSegmentBytes(4 << 10)}
			st, q := openActive(t, dir, opts...)
			writeActiveMsgs(t, q, 0, 300)
			segs := logFiles(t, dir)
			require.Greater(t, len(segs), 5)
			for i, s := range q.segs {
				assert.Equal(t, i == len(q.segs)-1 && p != SyncAlways, s.mm != nil, "segment %d mapped", i)
			}
			for _, name := range segs[:len(segs)-1] {
				size, frames := fileFramesEnd(t, name)
				assert.Equal(t, frames, size, name)
				_, err := os.Stat(name[:len(name)-len(".log")] + ".index")
				require.NoError(t, err)
			}
			checkActiveMsgs(t, q, 300)
			require.NoError(t, st.Close())
			size, frames := fileFramesEnd(t, segs[len(segs)-1])
			assert.Equal(t, frames, size)

			st, q = openActive(t, dir, opts...)
			defer st.Close()
			assert.Empty(t, st.Recovery().Truncated)
			assert.Empty(t, st.Recovery().RebuiltIndexes)
			checkActiveMsgs(t, q, 300)
		})
	}
}

// A file system that cannot reserve space is written with pwrite: the
// segment that found out is unmapped, later ones are not mapped.
func TestMappedFallbackWithoutFallocate(t *testing.T) {
	orig := fallocateFile
	calls := 0
	fallocateFile = func(f *os.File, off, n int64) error {
		calls++
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: syscall.EOPNOTSUPP}
	}
	defer func() { fallocateFile = orig }()

	dir := t.TempDir()
	opts := []Option{WithSync(SyncNever), WithSegmentBytes(4 << 10)}
	st, q := openActive(t, dir, opts...)
	require.NotNil(t, q.segs[0].mm, "mapped until the first reserve")
	writeActiveMsgs(t, q, 0, 300)
	assert.Equal(t, 1, calls)
	assert.True(t, st.noReserve.Load())
	checkUnmappedExactAndReopen(t, dir, st, q, 300, opts...)
}

// A full disk fails the reserve, and so the write, before anything is
// copied into the mapping: the queue fails and keeps what it acknowledged.
func TestMappedReserveFailureFailsQueue(t *testing.T) {
	orig := fallocateFile
	var full bool
	fallocateFile = func(f *os.File, off, n int64) error {
		if full {
			return &os.PathError{Op: "fallocate", Path: f.Name(), Err: syscall.ENOSPC}
		}
		return orig(f, off, n)
	}
	defer func() { fallocateFile = orig }()

	dir := t.TempDir()
	opts := []Option{WithSync(SyncNever), WithSegmentBytes(1 << 20)}
	st, q := openActive(t, dir, opts...)
	writeActiveMsgs(t, q, 0, 100)
	full = true
	var err error
	for i := 100; err == nil; i++ { // until the 64 KiB reserved are used up
		_, err = q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg(activeBody(i))})
	}
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, syscall.ENOSPC)
	_, next := q.Offsets()
	require.ErrorIs(t, st.Close(), ErrFailed)
	full = false

	st, q = openActive(t, dir, opts...)
	defer st.Close()
	checkActiveMsgs(t, q, int(next))
}

// Readers read the active segment with pread while a writer copies frames
// into its mapping: each sees whole frames up to the offsets published.
func TestMappedReadsRaceWrites(t *testing.T) {
	dir := t.TempDir()
	st, q := openActive(t, dir, WithSync(SyncNever), WithSegmentBytes(64<<10), WithCache(0, 0))
	defer st.Close()
	const n = 3000
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			dst := make([]*ferry.EnhancedMessage, 16)
			for off := int64(0); off < n; {
				k, err := q.Read(context.Background(), off, dst)
				if !assert.NoError(t, err) {
					return
				}
				for _, m := range dst[:k] {
					if !assert.Equal(t, activeBody(int(off)), string(m.Body)) {
						return
					}
					off++
				}
			}
		})
	}
	writeActiveMsgs(t, q, 0, n)
	wg.Wait()
}
