package natsstore

import (
	"bytes"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cursor's value round-trips with and without a finished set, refuses
// every cut of a value with one, and refuses a set that is not above its
// cursor; a value of the format before finished sets (16 bytes) reads as
// one without a set.
func TestCursorValueFinishedSet(t *testing.T) {
	plain := encodeCursor(5, 3, nil)
	require.Len(t, plain, 16, "no set: the 16-byte value of before")
	off, tok, set, err := decodeCursorSet(plain)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(5), uint64(3)}, []any{off, tok})
	assert.Nil(t, set)

	v := encodeCursor(5, 3, []int64{6, 9, 1 << 40})
	off, tok, set, err = decodeCursorSet(v)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(5), uint64(3)}, []any{off, tok})
	assert.Equal(t, []int64{6, 9, 1 << 40}, set)
	for n := range len(v) {
		if n == 16 {
			continue // the value without its set: valid
		}
		_, _, _, err := decodeCursorSet(v[:n])
		assert.ErrorIs(t, err, ferry.ErrCorrupt, "cut at %d", n)
	}
	_, _, _, err = decodeCursorSet(append(bytes.Clone(v), 0))
	assert.ErrorIs(t, err, ferry.ErrCorrupt, "a byte after the set")
	_, _, _, err = decodeCursorSet(encodeCursor(5, 3, []int64{5}))
	assert.ErrorIs(t, err, ferry.ErrCorrupt, "a set not above its cursor")
}
