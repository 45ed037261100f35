package filestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// testdata/v1store was written by the store before queue identity:
// untagged frames (version 1) in four segments of queue old[1], indexes
// of version 1, a cursor file of version 1 (g at 150), no STORE file.
//
// Opened now it becomes a legacy store: everything reads as it was, new
// frames are tagged, the cursor file is rewritten with the store's ID,
// and so is every index rebuilt.
func TestOpenVersion1Store(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "v1store"))))
	meta := ferry.TopicMeta{Name: "old", Queues: 2, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}
	opts := []Option{WithSegmentBytes(4 << 10), WithVerify()}
	check := func(st *Store, n int) {
		t.Helper()
		fq, err := st.OpenQueue(ctx, meta, 1)
		require.NoError(t, err)
		_, next := fq.Offsets()
		require.Equal(t, int64(n), next)
		dst := make([]*ferry.EnhancedMessage, 1)
		for off := range next {
			_, err := fq.Read(ctx, off, dst)
			require.NoError(t, err)
			want := fmt.Sprintf("v1 body %d", off)
			if off >= 200 {
				want = fmt.Sprintf("v2 body %d", off)
			}
			require.Equal(t, want, string(dst[0].Body))
			require.Equal(t, 1, dst[0].Queue)
		}
		got, err := st.Load(ctx, "old", "g", 2)
		require.NoError(t, err)
		assert.Equal(t, []int64{-1, 150}, got)
	}
	st, err := Open(dir, opts...)
	require.NoError(t, err)
	assert.True(t, st.legacy)
	assert.Empty(t, st.Recovery().RebuiltIndexes, "indexes of version 1 are read")
	check(st, 200)
	fq, err := st.OpenQueue(ctx, meta, 1)
	require.NoError(t, err)
	for i := 200; i < 300; i++ {
		_, err := fq.Write(ctx, []*ferry.EnhancedMessage{{Message: ferry.Message{Topic: "old", Body: []byte(fmt.Sprintf("v2 body %d", i))}}})
		require.NoError(t, err)
	}
	require.NoError(t, st.Close())
	b, err := os.ReadFile(filepath.Join(dir, cursorFile))
	require.NoError(t, err)
	assert.Equal(t, cursorMagic, string(b[4:8]), "the cursor file is rewritten as version 2")

	st, err = Open(dir, opts...)
	require.NoError(t, err)
	defer st.Close()
	assert.True(t, st.legacy, "the legacy flag is kept")
	check(st, 300)
}
