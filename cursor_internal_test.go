package ferry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A queue's cursor slot commits like CommitFenced: fenced by token, seen
// by Load and Cursors, and still working after the group was forgotten
// (the commit makes the cursor again, as a Commit would).
func TestMemoryCursorSlot(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryCursorStore()
	sl := s.slot("t", "g", 2)
	require.NoError(t, sl.commit(5, 3, nil))
	offs, err := s.Load(ctx, "t", "g", 3)
	require.NoError(t, err)
	require.Equal(t, []int64{-1, -1, 5}, offs)

	require.ErrorIs(t, s.CommitFenced(ctx, "t", "g", 2, 9, 2), ErrFenced, "a slot's token fences CommitFenced")
	require.NoError(t, s.CommitFenced(ctx, "t", "g", 2, 9, 4))
	require.ErrorIs(t, sl.commit(6, 3, nil), ErrFenced, "and CommitFenced's fences the slot")
	require.ErrorIs(t, sl.commit(-1, 4, nil), ErrOffsetOutOfRange)

	require.NoError(t, s.Forget(ctx, "t", "g"))
	require.NoError(t, sl.commit(7, 1, nil), "forgotten: the tokens went with the cursor")
	cs, err := s.Cursors(ctx, "t", 3)
	require.NoError(t, err)
	require.Equal(t, []int64{-1, -1, 7}, cs.Groups["g"].Offsets)

	require.NoError(t, s.Close())
	require.ErrorIs(t, sl.commit(8, 1, nil), ErrClosed)
}
