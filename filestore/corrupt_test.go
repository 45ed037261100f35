package filestore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

var corruptMeta = ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}

func corruptOptions(extra ...filestore.Option) []filestore.Option {
	return append([]filestore.Option{filestore.WithSegmentBytes(12 << 10), filestore.WithMaxFrameBytes(64 << 10), filestore.WithSync(filestore.SyncNever)}, extra...)
}

// fillStore writes 1000 messages in batches of 1 to 4 over several
// segments, commits a cursor, and returns the messages by offset.
func fillStore(t *testing.T, dir string) []*ferry.EnhancedMessage {
	t.Helper()
	ctx := context.Background()
	st, err := filestore.Open(dir, corruptOptions()...)
	require.NoError(t, err)
	require.NoError(t, st.SaveTopic(ctx, corruptMeta))
	q, err := st.OpenQueue(ctx, corruptMeta, 0)
	require.NoError(t, err)
	var all []*ferry.EnhancedMessage
	for i := 0; len(all) < 1000; i++ {
		batch := make([]*ferry.EnhancedMessage, 1+i%4)
		for j := range batch {
			batch[j] = msg("t", len(all)+j)
		}
		_, err := q.Write(ctx, batch)
		require.NoError(t, err)
		all = append(all, batch...)
	}
	require.NoError(t, st.Commit(ctx, "t", "g", 0, 120))
	require.NoError(t, st.Close())
	return all
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "topics", "t", "0", "*.log"))
	require.NoError(t, err)
	slices.Sort(segs)
	require.Greater(t, len(segs), 3)
	return segs
}

func size(t *testing.T, name string) int64 {
	t.Helper()
	fi, err := os.Stat(name)
	require.NoError(t, err)
	return fi.Size()
}

func appendTo(t *testing.T, name string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(b)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

func flipByte(t *testing.T, name string, at int64) {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	b[at] ^= 0x5a
	require.NoError(t, os.WriteFile(name, b, 0o600))
}

// checkPrefix opens dir and checks that the queue holds an intact prefix
// of all, at least keep messages long; it returns the store.
func checkPrefix(t *testing.T, dir string, all []*ferry.EnhancedMessage, keep int64, opts ...filestore.Option) *filestore.Store {
	t.Helper()
	st, err := filestore.Open(dir, corruptOptions(opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	q, err := st.OpenQueue(context.Background(), corruptMeta, 0)
	require.NoError(t, err)
	oldest, next := q.Offsets()
	require.Equal(t, int64(0), oldest)
	require.GreaterOrEqual(t, next, keep)
	require.LessOrEqual(t, next, int64(len(all)))
	got := readAll(t, q, 0)
	require.Len(t, got, int(next))
	for i, m := range got {
		assertSame(t, all[i], m)
	}
	return st
}

// firstOffset returns the base offset in a segment's file name.
func firstOffset(t *testing.T, name string) int64 {
	t.Helper()
	var base int64
	_, err := fmtSscanf(filepath.Base(name), &base)
	require.NoError(t, err)
	return base
}

func TestCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string) // returns nothing; the check follows
		check  func(t *testing.T, dir string, all []*ferry.EnhancedMessage)
	}{
		{
			name: "truncate newest segment at random points",
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				segs := segments(t, dir)
				newest := segs[len(segs)-1]
				orig, err := os.ReadFile(newest)
				require.NoError(t, err)
				base := firstOffset(t, newest)
				points := []int{0, 1, 7, 8, 36, 37, len(orig) - 1}
				for range 20 {
					points = append(points, rng.IntN(len(orig)))
				}
				for _, p := range points {
					require.NoError(t, os.WriteFile(newest, orig[:p], 0o600))
					st := checkPrefix(t, dir, all, base)
					// The queue takes writes again after the cut.
					q, err := st.OpenQueue(context.Background(), corruptMeta, 0)
					require.NoError(t, err)
					_, next := q.Offsets()
					first, err := q.Write(context.Background(), []*ferry.EnhancedMessage{msg("t", 999)})
					require.NoError(t, err)
					require.Equal(t, next, first)
					require.NoError(t, st.Close())
					// Restore the file for the next point.
					require.NoError(t, os.WriteFile(newest, orig, 0o600))
				}
			},
		},
		{
			name: "garbage appended to the newest segment",
			damage: func(t *testing.T, dir string) {
				segs := segments(t, dir)
				junk := make([]byte, 1000)
				for i := range junk {
					junk[i] = byte(rng.IntN(256))
				}
				appendTo(t, segs[len(segs)-1], junk)
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				st := checkPrefix(t, dir, all, int64(len(all)))
				tr := st.Recovery().Truncated
				require.Len(t, tr, 1)
				assert.Equal(t, int64(1000), tr[0].Cut)
				assert.ErrorIs(t, tr[0].Err, ferry.ErrCorrupt)
			},
		},
		{
			name: "zeros appended to the newest segment: no phantom records",
			damage: func(t *testing.T, dir string) {
				segs := segments(t, dir)
				appendTo(t, segs[len(segs)-1], make([]byte, 4096))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				st := checkPrefix(t, dir, all, int64(len(all)))
				q, err := st.OpenQueue(context.Background(), corruptMeta, 0)
				require.NoError(t, err)
				_, next := q.Offsets()
				assert.Equal(t, int64(len(all)), next)
				require.Len(t, st.Recovery().Truncated, 1)
			},
		},
		{
			name: "huge length field at the tail: refused before allocating",
			damage: func(t *testing.T, dir string) {
				segs := segments(t, dir)
				appendTo(t, segs[len(segs)-1], []byte{0xf0, 0xff, 0xff, 0xff, 1, 2, 3, 4, 0xf1})
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				st := checkPrefix(t, dir, all, int64(len(all)))
				runtime.ReadMemStats(&after)
				assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20))
				require.Len(t, st.Recovery().Truncated, 1)
			},
		},
		{
			name: "flipped bytes in the last frame of the newest segment: cut like a torn tail (lost: that frame)",
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				segs := segments(t, dir)
				newest := segs[len(segs)-1]
				orig, err := os.ReadFile(newest)
				require.NoError(t, err)
				base := firstOffset(t, newest)
				last := lastFrameAt(t, orig)
				for range 10 {
					at := last + rng.IntN(len(orig)-last)
					flipByte(t, newest, int64(at))
					st := checkPrefix(t, dir, all, base)
					q, err := st.OpenQueue(context.Background(), corruptMeta, 0)
					require.NoError(t, err)
					_, next := q.Offsets()
					assert.Less(t, next, int64(len(all)), "the damaged frame is cut")
					require.Len(t, st.Recovery().Truncated, 1)
					require.NoError(t, st.Close())
					require.NoError(t, os.WriteFile(newest, orig, 0o600))
				}
			},
		},
		{
			name: "a bad frame followed by good frames in the newest segment: detected, nothing cut; repaired on request (lost: the frames after it)",
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				segs := segments(t, dir)
				newest := segs[len(segs)-1]
				base := firstOffset(t, newest)
				flipByte(t, newest, 40) // in the first frame's messages
				damaged, err := os.ReadFile(newest)
				require.NoError(t, err)
				_, err = filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), filepath.Base(newest))
				assert.Contains(t, err.Error(), "at byte 0")
				assert.Contains(t, err.Error(), "WithRepair")
				after, err := os.ReadFile(newest)
				require.NoError(t, err)
				require.Equal(t, damaged, after, "nothing is cut")

				st := checkPrefix(t, dir, all, base, filestore.WithRepair())
				tr := st.Recovery().Truncated
				require.Len(t, tr, 1)
				assert.True(t, tr[0].Damaged)
				assert.Equal(t, int64(0), tr[0].At)
				assert.Equal(t, int64(len(damaged)), tr[0].Cut)
				// The intact frames after the bad one: all but its own messages.
				assert.Positive(t, tr[0].Dropped)
				assert.Less(t, tr[0].Dropped, int64(len(all))-base)
				saved, err := os.ReadFile(filepath.Join(dir, tr[0].Saved))
				require.NoError(t, err)
				assert.Equal(t, damaged, saved, "the cut bytes are kept aside")
				require.NoError(t, st.Close())
				st = checkPrefix(t, dir, all, base)
				assert.Empty(t, st.Recovery().Truncated)
			},
		},
		{
			name: "flipped byte early in an older segment: ErrCorrupt on read, or at Open with WithVerify",
			damage: func(t *testing.T, dir string) {
				flipByte(t, segments(t, dir)[1], 40)
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions(filestore.WithVerify())...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), filepath.Base(segments(t, dir)[1]))

				st, err := filestore.Open(dir, corruptOptions()...)
				require.NoError(t, err)
				defer st.Close()
				q, err := st.OpenQueue(context.Background(), corruptMeta, 0)
				require.NoError(t, err)
				base := firstOffset(t, segments(t, dir)[1])
				_, err = q.Read(context.Background(), base, make([]*ferry.EnhancedMessage, 10))
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), filepath.Base(segments(t, dir)[1]))
				// The rest is readable.
				n, err := q.Read(context.Background(), 0, make([]*ferry.EnhancedMessage, 1))
				require.NoError(t, err)
				assert.Equal(t, 1, n)
			},
		},
		{
			name: "flipped byte at the end of an older segment: ErrCorrupt at Open",
			damage: func(t *testing.T, dir string) {
				s := segments(t, dir)[2]
				flipByte(t, s, size(t, s)-2)
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), filepath.Base(segments(t, dir)[2]))
			},
		},
		{
			name: "older segment truncated: ErrCorrupt at Open",
			damage: func(t *testing.T, dir string) {
				s := segments(t, dir)[0]
				require.NoError(t, os.Truncate(s, size(t, s)-5))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
		{
			name: "zeros after the frames of an older segment (a lost cut of reserved space): ErrCorrupt at Open",
			damage: func(t *testing.T, dir string) {
				appendTo(t, segments(t, dir)[1], make([]byte, 8192))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), filepath.Base(segments(t, dir)[1]))
			},
		},
		{
			name: "missing middle segment: ErrCorrupt at Open",
			damage: func(t *testing.T, dir string) {
				require.NoError(t, os.Remove(segments(t, dir)[1]))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
		{
			name: "damaged, truncated, garbage and missing index files are rebuilt",
			damage: func(t *testing.T, dir string) {
				segs := segments(t, dir)
				idx := func(i int) string { return segs[i][:len(segs[i])-len(".log")] + ".index" }
				flipByte(t, idx(0), 20)
				require.NoError(t, os.Truncate(idx(1), 10))
				require.NoError(t, os.WriteFile(idx(2), []byte("FIDX\x01\x00\x00\x00 not an index at all"), 0o600))
				require.NoError(t, os.Remove(idx(3)))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				st := checkPrefix(t, dir, all, int64(len(all)))
				assert.Len(t, st.Recovery().RebuiltIndexes, 4)
				require.NoError(t, st.Close())
				st = checkPrefix(t, dir, all, int64(len(all)))
				assert.Empty(t, st.Recovery().RebuiltIndexes, "rebuilt indexes are kept")
			},
		},
		{
			name: "a cursor beyond a cut tail is clamped to the new end",
			damage: func(t *testing.T, dir string) {
				st, err := filestore.Open(dir, corruptOptions()...)
				require.NoError(t, err)
				require.NoError(t, st.Commit(context.Background(), "t", "g", 0, 1000))
				require.NoError(t, st.Close())
				segs := segments(t, dir)
				require.NoError(t, os.Truncate(segs[len(segs)-1], 0))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				segs := segments(t, dir)
				base := firstOffset(t, segs[len(segs)-1])
				st := checkPrefix(t, dir, all, base)
				got, err := st.Load(context.Background(), "t", "g", 1)
				require.NoError(t, err)
				assert.Equal(t, []int64{base}, got)
				assert.Equal(t, []filestore.ClampedCursor{{Topic: "t", Group: "g", Queue: 0, From: 1000, To: base}}, st.Recovery().ClampedCursors)
			},
		},
		{
			name: "damaged cursor file: ErrCorrupt",
			damage: func(t *testing.T, dir string) {
				flipByte(t, filepath.Join(dir, "cursors"), 6)
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), "cursors")
			},
		},
		{
			name: "truncated cursor file: ErrCorrupt",
			damage: func(t *testing.T, dir string) {
				require.NoError(t, os.Truncate(filepath.Join(dir, "cursors"), 2))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
		{
			name: "leftover temporary cursor file is ignored",
			damage: func(t *testing.T, dir string) {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "cursors.tmp"), []byte("half"), 0o600))
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				st := checkPrefix(t, dir, all, int64(len(all)))
				got, err := st.Load(context.Background(), "t", "g", 1)
				require.NoError(t, err)
				assert.Equal(t, []int64{120}, got)
				assert.NoFileExists(t, filepath.Join(dir, "cursors.tmp"))
			},
		},
		{
			name: "damaged topic metadata: ErrCorrupt",
			damage: func(t *testing.T, dir string) {
				flipByte(t, filepath.Join(dir, "topics", "t", "meta"), 10)
			},
			check: func(t *testing.T, dir string, all []*ferry.EnhancedMessage) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			all := fillStore(t, dir)
			if c.damage != nil {
				c.damage(t, dir)
			}
			c.check(t, dir, all)
		})
	}
}

// lastFrameAt returns the position of the last frame of a segment's
// bytes, walking the length fields.
func lastFrameAt(t *testing.T, b []byte) int {
	t.Helper()
	last := 0
	for pos := 0; pos < len(b); {
		last = pos
		pos += 8 + int(binary.LittleEndian.Uint32(b[pos:]))
	}
	return last
}

func fmtSscanf(name string, base *int64) (int, error) { return fmt.Sscanf(name, "%020d.log", base) }
