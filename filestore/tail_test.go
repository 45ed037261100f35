package filestore

import (
	"io"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// liveFile is a segment file as a reader without the lock sees it while
// its owner writes: ReadAt serves images[stage], and before each read
// moves(stage, off) says whether the file has changed by then.
type liveFile struct {
	images [][]byte
	stage  int
	moves  func(stage int, off int64) bool
}

func (f *liveFile) ReadAt(p []byte, off int64) (int, error) {
	for f.stage+1 < len(f.images) && f.moves(f.stage, off) {
		f.stage++
	}
	b := f.images[f.stage]
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// TestJudgeTail: the one judgement of a newest segment's tail, for each
// way a reader can meet it. Frames f0, f1, f2 hold offsets 0-2, 3-5,
// 6-8; the reader scans the length of the first image.
func TestJudgeTail(t *testing.T) {
	f0, f1, f2 := sampleFrame(0, 3), sampleFrame(3, 3), sampleFrame(6, 3)
	cat := func(bs ...[]byte) []byte { return slices.Concat(bs...) }
	zeros := func(n int) []byte { return make([]byte, n) }
	at1, at3 := int64(len(f0)), int64(len(f0)+len(f1)+len(f2))
	flipped := slices.Clone(f1)
	flipped[60] ^= 0x5a
	other := appendFrame(nil, testKey.tag+1, 3, 1, 1, 1, sampleFrame(3, 1)[frameHeader:])
	afterScan := func(stage int, off int64) bool { return off > 0 }                 // the scan read the file from 0
	atReread := func(stage int, off int64) bool { return stage == 1 && off == at1 } // judgeTail reads the bad frame again
	cases := []struct {
		name   string
		images [][]byte
		moves  func(stage int, off int64) bool
		want   tailKind // 0: the file ends with its frames
		at     int64
		next   int64
		first  int64
		drop   int64
	}{
		{name: "zeros of reserved space: torn", images: [][]byte{cat(f0, f1, zeros(4096))}, want: tailTorn, at: int64(len(f0) + len(f1)), next: 6, first: -1},
		{name: "half a frame: torn", images: [][]byte{cat(f0, f1[:50])}, want: tailTorn, at: at1, next: 3, first: -1},
		{
			name:   "written while scanned: frames appear after the zeros the scan met (read on, to the end)",
			images: [][]byte{cat(f0, zeros(len(f1)+len(f2)+100)), cat(f0, f1, f2, zeros(100))},
			moves:  afterScan, want: tailTorn, at: at3, next: 9, first: -1,
		},
		{
			name:   "written out of order: a later page new, the bad frame's page old, until it is read again",
			images: [][]byte{cat(f0, zeros(len(f1)), f2), cat(f0, f1, f2)},
			moves:  func(stage int, off int64) bool { return off == at1 }, next: 9,
		},
		{
			name:   "a write in progress cut back by its undo: torn",
			images: [][]byte{cat(f0, zeros(len(f1)+len(f2))), cat(f0, f1, f2), f0},
			moves:  func(stage int, off int64) bool { return stage == 0 && afterScan(stage, off) || atReread(stage, off) },
			want:   tailTorn, at: at1, next: 3, first: -1,
		},
		{name: "a flipped byte with intact frames after it: damage", images: [][]byte{cat(f0, flipped, f2)}, want: tailDamage, at: at1, next: 3, first: 6, drop: 3},
		{name: "a flipped byte in the last frame: torn", images: [][]byte{cat(f0, f1, f2[:40], []byte{f2[40] ^ 1}, f2[41:])}, want: tailTorn, at: int64(len(f0) + len(f1)), next: 6, first: -1},
		{name: "another queue's frame at the end: damage", images: [][]byte{cat(f0, other)}, want: tailDamage, at: at1, next: 3, first: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.moves == nil {
				c.moves = func(int, int64) bool { return false }
			}
			r := &liveFile{images: c.images, moves: c.moves}
			s := &segment{name: "seg", base: 0, next: 0}
			var buf []byte
			v, err := scanNewest(r, s, int64(len(c.images[0])), fuzzMaxFrame, 4096, testKey, &buf, nil)
			require.NoError(t, err)
			assert.Equal(t, c.next, s.next, "frames read")
			if c.want == 0 {
				require.Nil(t, v)
				return
			}
			require.NotNil(t, v)
			assert.Equal(t, c.want, v.kind)
			assert.Equal(t, c.at, v.at)
			assert.Equal(t, c.first, v.first)
			assert.Equal(t, c.drop, v.dropped)
			assert.True(t, isCorrupt(v.err))
		})
	}
}
