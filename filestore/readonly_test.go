package filestore_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// dirState is every file and folder under dir: mode, size, modification
// time and a hash of the contents.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h := ""
		if !d.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h = fmt.Sprintf("%x", sha256.Sum256(b))
		}
		out[p] = fmt.Sprintf("%v %d %d %s", fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), h)
		return nil
	})
	require.NoError(t, err)
	return out
}

func openRO(t *testing.T, dir string, opts ...filestore.Option) *filestore.ReadOnlyStore {
	t.Helper()
	st, err := filestore.OpenReadOnly(dir, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// TestReadOnlyWritesNothing: every call of a read-only store, writes
// included, and Verify leave the directory as it was, to the byte and
// the modification time, torn tail and all.
func TestReadOnlyWritesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	all := fillStore(t, dir)
	segs := segments(t, dir)
	appendTo(t, segs[len(segs)-1], []byte{1, 2, 3, 0, 0, 0, 0}) // a torn tail Open would cut
	before := dirState(t, dir)

	st := openRO(t, dir, corruptOptions()...)
	metas, err := st.Topics(ctx)
	require.NoError(t, err)
	require.Equal(t, []ferry.TopicMeta{corruptMeta.Normalized()}, metas)
	q, err := st.OpenQueue(ctx, corruptMeta, 0)
	require.NoError(t, err)
	oldest, next := q.Offsets()
	require.Equal(t, int64(0), oldest)
	require.Equal(t, int64(len(all)), next)
	got := readAll(t, q, 0)
	require.Len(t, got, len(all))
	for i, m := range got {
		assertSame(t, all[i], m)
	}
	offs, err := st.Load(ctx, "t", "g", 1)
	require.NoError(t, err)
	require.Equal(t, []int64{120}, offs)
	cur, err := st.Cursors(ctx, "t", 1)
	require.NoError(t, err)
	require.Equal(t, map[string]ferry.Cursor{"g": {Group: "g", Offsets: []int64{120}}}, cur.Groups)
	infos, err := st.Segments(ctx, "t", 0)
	require.NoError(t, err)
	require.Len(t, infos, len(segs))
	last := infos[len(infos)-1]
	assert.Equal(t, int64(7), last.Bytes-last.Frames)
	assert.Error(t, last.TailErr)
	assert.True(t, infos[0].Sealed)
	assert.Positive(t, infos[0].IndexBytes)

	// Every write is refused.
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{msg("t", 0)})
	require.ErrorIs(t, err, filestore.ErrReadOnly)
	_, err = q.(ferry.TryWriter).TryWrite([]*ferry.EnhancedMessage{msg("t", 0)})
	require.ErrorIs(t, err, filestore.ErrReadOnly)
	require.ErrorIs(t, st.SaveTopic(ctx, ferry.TopicMeta{Name: "new", Queues: 1}), filestore.ErrReadOnly)
	require.ErrorIs(t, st.CreateTopic(ctx, ferry.TopicMeta{Name: "new", Queues: 1}), filestore.ErrReadOnly)
	require.ErrorIs(t, st.Commit(ctx, "t", "g", 0, 1), filestore.ErrReadOnly)
	require.ErrorIs(t, st.CommitFenced(ctx, "t", "g", 0, 1, 1), filestore.ErrReadOnly)
	require.ErrorIs(t, st.Forget(ctx, "t", "g"), filestore.ErrReadOnly)
	// A queue that does not exist is empty, and created nowhere.
	q2, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "other", Queues: 3}, 2)
	require.NoError(t, err)
	o, n := q2.Offsets()
	require.Equal(t, [2]int64{0, 0}, [2]int64{o, n})

	rep, err := filestore.Verify(dir, corruptOptions()...)
	require.NoError(t, err)
	require.False(t, rep.Damaged(), "%v", rep.Problems)
	require.Len(t, rep.Problems, 1, "the torn tail: %v", rep.Problems)
	assert.Equal(t, int64(len(all)), rep.Messages)

	require.NoError(t, q.Close())
	require.NoError(t, st.Close())
	require.NoError(t, st.Close())
	_, err = st.Topics(ctx)
	require.ErrorIs(t, err, ferry.ErrClosed)
	require.Equal(t, before, dirState(t, dir))
}

func TestReadOnlyNeedsAStore(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nothing")
	_, err := filestore.OpenReadOnly(missing)
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = os.Stat(missing)
	require.ErrorIs(t, err, fs.ErrNotExist, "OpenReadOnly created the directory")

	empty := t.TempDir()
	_, err = filestore.OpenReadOnly(empty)
	require.ErrorIs(t, err, fs.ErrNotExist)
	es, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, es)
}

// TestReadOnlyTakesNoLock: flock locks belong to the open file, so a
// second Open in this process is refused like one in another process;
// the read-only open takes none, so both orders work and the owner's
// lock stays exclusive.
func TestReadOnlyTakesNoLock(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir)
	ro := openRO(t, dir)
	_, err := filestore.Open(dir)
	require.ErrorIs(t, err, filestore.ErrLocked, "the owner still holds the directory")
	require.NoError(t, w.Close())
	// With the read-only store open, the owner opens again.
	w2 := open(t, dir)
	require.NoError(t, w2.Close())
	require.NoError(t, ro.Close())
}

// TestReadOnlyFollowsWriter reads, with a read-only store, every message
// a writer of the same directory appends meanwhile, across roll-overs,
// under each sync policy (mapped and reserved active segments under
// SyncNever and SyncEvery: a reader sees zeros past the frames).
func TestReadOnlyFollowsWriter(t *testing.T) {
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncNever, filestore.SyncEvery(time.Millisecond)} {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}
			w := open(t, dir, filestore.WithSync(p), filestore.WithSegmentBytes(4096))
			require.NoError(t, w.SaveTopic(ctx, meta))
			wq := openQueue(t, w, meta, 0)
			ro := openRO(t, dir)
			rq, err := ro.OpenQueue(ctx, meta, 0)
			require.NoError(t, err)

			const total = 600
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < total; i += 3 {
					_, err := wq.Write(ctx, []*ferry.EnhancedMessage{msg("t", i), msg("t", i+1), msg("t", i+2)})
					if !assert.NoError(t, err) {
						return
					}
				}
			}()
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a watchdog, not a timing
			defer cancel()
			dst := make([]*ferry.EnhancedMessage, 16)
			for off := int64(0); off < total; {
				n, err := rq.Read(rctx, off, dst)
				require.NoError(t, err)
				for _, m := range dst[:n] {
					require.Equal(t, off, m.Offset)
					require.Equal(t, fmt.Sprint("body ", off), string(m.Body))
					off++
				}
			}
			wg.Wait()
			_, next := rq.Offsets()
			require.Equal(t, int64(total), next)
			infos, err := ro.Segments(ctx, "t", 0)
			require.NoError(t, err)
			require.Greater(t, len(infos), 3, "rolled over")

			// A cursor the owner commits is seen once the file is
			// written: at Commit under SyncAlways, at Close otherwise.
			require.NoError(t, w.Commit(ctx, "t", "g", 0, 42))
			if p != filestore.SyncAlways {
				require.NoError(t, w.Close())
			}
			offs, err := ro.Load(ctx, "t", "g", 1)
			require.NoError(t, err)
			require.Equal(t, []int64{42}, offs)

			// A blocked Read ends with its ctx, and with Close.
			short, cancelShort := context.WithCancel(ctx)
			cancelShort()
			_, err = rq.Read(short, total, dst)
			require.ErrorIs(t, err, context.Canceled)
			done := make(chan error, 1)
			go func() { _, err := rq.Read(ctx, total, dst); done <- err }()
			require.NoError(t, ro.Close())
			require.ErrorIs(t, <-done, ferry.ErrClosed)
		})
	}
}

// TestReadOnlyAcrossRetention: while the owner drops old segments, the
// read-only queue's oldest moves on, and a read below it is
// ErrOffsetOutOfRange, never a missing file.
func TestReadOnlyAcrossRetention(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 50, MaxBytes: ferry.Unlimited}}
	w := open(t, dir, filestore.WithSync(filestore.SyncNever), filestore.WithSegmentBytes(4096))
	require.NoError(t, w.SaveTopic(ctx, meta))
	wq := openQueue(t, w, meta, 0)
	ro := openRO(t, dir)
	rq, err := ro.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	for i := range 300 {
		_, err := wq.Write(ctx, []*ferry.EnhancedMessage{msg("t", i)})
		require.NoError(t, err)
		if i%20 == 0 {
			oldest, next := rq.Offsets()
			require.LessOrEqual(t, oldest, next)
			dst := make([]*ferry.EnhancedMessage, 4)
			if _, err := rq.Read(ctx, 0, dst); oldest > 0 || err != nil {
				require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
			}
		}
	}
	oldest, next := rq.Offsets()
	require.Equal(t, int64(300), next)
	require.Positive(t, oldest)
	got := readAll(t, rq, oldest)
	require.Len(t, got, int(next-oldest))
}

// TestVerifyFindsDamage: a flipped byte in a sealed segment is damage,
// named with its file and byte; so is a bad cursor file.
func TestVerifyFindsDamage(t *testing.T) {
	dir := t.TempDir()
	fillStore(t, dir)
	segs := segments(t, dir)
	flipByte(t, segs[1], 100)
	rep, err := filestore.Verify(dir, corruptOptions()...)
	require.NoError(t, err)
	require.True(t, rep.Damaged())
	rel, _ := filepath.Rel(dir, segs[1])
	require.Equal(t, rel, rep.Problems[0].File, "%v", rep.Problems)
	require.True(t, rep.Problems[0].Damage)
	require.LessOrEqual(t, rep.Problems[0].Offset, int64(100))

	// Reading it read-only is ErrCorrupt, naming the file.
	ro := openRO(t, dir, corruptOptions()...)
	q, err := ro.OpenQueue(context.Background(), corruptMeta, 0)
	require.NoError(t, err)
	base := firstOffset(t, segs[1])
	_, err = q.Read(context.Background(), base, make([]*ferry.EnhancedMessage, 1000))
	if err == nil { // the frames before the flip are served; the next read fails
		_, next := q.Offsets()
		require.Greater(t, next, base)
		return
	}
	require.ErrorIs(t, err, ferry.ErrCorrupt)

	flipByte(t, filepath.Join(dir, "cursors"), 10)
	rep, err = filestore.Verify(dir, corruptOptions()...)
	require.NoError(t, err)
	require.Equal(t, "cursors", rep.Problems[len(rep.Problems)-1].File)
}
