package filestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestRealFullDisk fills a real small file system (a 2 MiB tmpfs, which
// needs root) under every policy, with single messages and batches that
// span segments: the write that finds it full fails with ErrFailed, the
// queue keeps failing, and once space is freed the store reopens with
// every acknowledged message and takes writes again.
func TestRealFullDisk(t *testing.T) {
	if _, err := mountTmpfs(t, 1<<20); err != nil {
		t.Skipf("no small file system to fill (this test needs root and tmpfs; the injected failures of TestFaultAtEveryCall run everywhere): %v", err)
	}
	for _, p := range []SyncPolicy{SyncAlways, SyncEvery(time.Hour), SyncNever} {
		for _, batch := range []int{1, 7} {
			t.Run(fmt.Sprintf("%s/batch%d", p, batch), func(t *testing.T) {
				testRealFullDisk(t, p, batch)
			})
		}
	}
}

func testRealFullDisk(t *testing.T, p SyncPolicy, batch int) {
	ctx := context.Background()
	mnt, err := mountTmpfs(t, 2<<20)
	require.NoError(t, err)
	ballast := filepath.Join(mnt, "ballast")
	require.NoError(t, os.WriteFile(ballast, make([]byte, 256<<10), 0o600))
	dir := filepath.Join(mnt, "store")
	opts := []Option{WithSync(p), WithSegmentBytes(64 << 10)}
	st, q := openActive(t, dir, opts...)
	body := func(i int) string { return fmt.Sprintf("%d-%s", i, strings.Repeat("x", 900)) }
	acked := 0
	for {
		msgs := make([]*ferry.EnhancedMessage, batch)
		for i := range msgs {
			msgs[i] = testMsg(body(acked + i))
		}
		if _, err = q.Write(ctx, msgs); err != nil {
			break
		}
		acked += batch
	}
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Greater(t, acked, 1000, "the disk filled up early")
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg(body(acked))})
	require.ErrorIs(t, err, ErrFailed)
	require.Error(t, st.Close())

	require.NoError(t, os.Remove(ballast))
	st, q = openActive(t, dir, opts...)
	defer st.Close()
	_, next := q.Offsets()
	require.GreaterOrEqual(t, next, int64(acked))
	dst := make([]*ferry.EnhancedMessage, 64)
	for off := int64(0); off < next; {
		k, err := q.Read(ctx, off, dst)
		require.NoError(t, err)
		for _, m := range dst[:k] {
			require.Equal(t, off, m.Offset)
			require.Equal(t, body(int(off)), string(m.Body))
			off++
		}
	}
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg(body(int(next)))})
	require.NoError(t, err)
}
