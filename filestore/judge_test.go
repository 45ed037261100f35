package filestore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// TestTailJudgedAlike: Open's recovery, Verify and the read-only store
// tell damage from a torn tail the same way, for each kind of bad end of
// a newest segment, and say where: damage is ErrCorrupt naming the file
// and byte everywhere (Open refuses the store, Verify reports DAMAGE, the
// read-only store marks the segment and fails a Read at or beyond it); a
// torn tail is a note and the end, which Open cuts.
func TestTailJudgedAlike(t *testing.T) {
	ctx := context.Background()
	otherDir := t.TempDir()
	fillStore(t, otherDir)
	otherSeg, err := os.ReadFile(segments(t, otherDir)[0])
	require.NoError(t, err)
	foreign := otherSeg[:8+binary.LittleEndian.Uint32(otherSeg)] // a frame of another store

	cases := []struct {
		name   string
		spoil  func(t *testing.T, newest string, b []byte) (at int64)
		damage bool
	}{
		{"a flipped byte in the first frame, intact frames after it", func(t *testing.T, newest string, b []byte) int64 {
			flipByte(t, newest, 40)
			return 0
		}, true},
		{"a flipped byte in the last frame", func(t *testing.T, newest string, b []byte) int64 {
			last := int64(lastFrameAt(t, b))
			flipByte(t, newest, last+20)
			return last
		}, false},
		{"zeros after the last frame (space reserved)", func(t *testing.T, newest string, b []byte) int64 {
			appendTo(t, newest, make([]byte, 8192))
			return int64(len(b))
		}, false},
		{"half a frame after the last one", func(t *testing.T, newest string, b []byte) int64 {
			appendTo(t, newest, b[:30])
			return int64(len(b))
		}, false},
		{"another store's frame after the last one", func(t *testing.T, newest string, b []byte) int64 {
			appendTo(t, newest, foreign)
			return int64(len(b))
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			fillStore(t, dir)
			segs := segments(t, dir)
			newest := segs[len(segs)-1]
			b, err := os.ReadFile(newest)
			require.NoError(t, err)
			at := c.spoil(t, newest, b)
			rel, err := filepath.Rel(dir, newest)
			require.NoError(t, err)
			where := fmt.Sprintf("%s at byte %d of %d", rel, at, size(t, newest))

			rep, err := filestore.Verify(dir, corruptOptions()...)
			require.NoError(t, err)
			require.Len(t, rep.Problems, 1, "%v", rep.Problems)
			p := rep.Problems[0]
			assert.Equal(t, c.damage, p.Damage, "%v", p)
			assert.Equal(t, !c.damage, p.TornTail, "%v", p)
			assert.Equal(t, rel, p.File)
			assert.Equal(t, at, p.Offset)

			ro := openRO(t, dir, corruptOptions()...)
			infos, err := ro.Segments(ctx, "t", 0)
			require.NoError(t, err)
			last := infos[len(infos)-1]
			assert.Equal(t, c.damage, last.Damage, "%v", last.TailErr)
			assert.Equal(t, at, last.Frames)
			q, err := ro.OpenQueue(ctx, corruptMeta, 0)
			require.NoError(t, err)
			_, next := q.Offsets()
			dst := make([]*ferry.EnhancedMessage, 10)
			_, err = q.Read(ctx, next+100, dst)
			if c.damage {
				require.ErrorIs(t, err, ferry.ErrCorrupt, "a read beyond the damage points at it")
				assert.Contains(t, err.Error(), where)
				assert.Contains(t, err.Error(), "the owner's next Open refuses the store")
				require.ErrorIs(t, last.TailErr, ferry.ErrCorrupt)
				assert.Contains(t, last.TailErr.Error(), where)
				rctx, cancel := context.WithCancel(ctx)
				defer cancel()
				_, err = q.Read(rctx, next, dst)
				require.ErrorIs(t, err, ferry.ErrCorrupt, "a read at the end, once the tail stays, is the damage")
			} else {
				require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
			}
			require.NoError(t, ro.Close())

			st, err := filestore.Open(dir, corruptOptions()...)
			if c.damage {
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), where)
				return
			}
			require.NoError(t, err)
			defer st.Close()
			tr := st.Recovery().Truncated
			require.Len(t, tr, 1)
			assert.False(t, tr[0].Damaged)
			assert.Equal(t, at, tr[0].At)
		})
	}
}

// TestVerifyNoClampPastDamage: a cursor past damage in a newest segment
// is not reported as one Open clamps (Open refuses the store, it clamps
// nothing), nor is the queue's range taken to end at the damage.
func TestVerifyNoClampPastDamage(t *testing.T) {
	dir := t.TempDir()
	all := fillStore(t, dir)
	st, err := filestore.Open(dir, corruptOptions()...)
	require.NoError(t, err)
	require.NoError(t, st.Commit(context.Background(), "t", "g", 0, int64(len(all))))
	require.NoError(t, st.Close())
	segs := segments(t, dir)
	flipByte(t, segs[len(segs)-1], 40)
	rep, err := filestore.Verify(dir, corruptOptions()...)
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1, "%v", rep.Problems)
	assert.True(t, rep.Problems[0].Damage)
}
