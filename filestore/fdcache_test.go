package filestore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// openFDs counts the descriptors of this process that are open on files
// under dir.
func openFDs(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && len(target) > len(dir) && target[:len(dir)] == dir {
			n++
		}
	}
	return n
}

// Sealed segments are opened on demand: however many a queue keeps, the
// store holds at most WithMaxOpenSegments descriptors of them between
// reads, while many readers read every segment at once, and retention
// deletes them under the readers.
func TestSealedSegmentDescriptorsAreBounded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := []Option{WithSync(SyncNever), WithSegmentBytes(4 << 10), WithCache(0, 0), WithMaxOpenSegments(3)}
	st, q := openActive(t, dir, opts...)
	writeActiveMsgs(t, q, 0, 600)
	require.Greater(t, len(q.segs), 20)
	assert.LessOrEqual(t, st.fds.open(), 3)
	require.NoError(t, st.Close())

	st, q = openActive(t, dir, opts...)
	defer st.Close()
	assert.LessOrEqual(t, st.fds.open(), 3, "after Open")
	assert.LessOrEqual(t, openFDs(t, dir), 3+2, "LOCK, the active segment and 3 sealed ones")
	var wg sync.WaitGroup
	for r := range 6 {
		wg.Go(func() {
			dst := make([]*ferry.EnhancedMessage, 7)
			for off := int64(r); off < 600; {
				n, err := q.Read(ctx, off, dst)
				if err != nil {
					t.Error(err)
					return
				}
				for _, m := range dst[:n] {
					if string(m.Body) != activeBody(int(m.Offset)) {
						t.Errorf("offset %d: %q", m.Offset, m.Body)
						return
					}
				}
				off += int64(n)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, st.fds.open(), 3, "after the reads")
	checkActiveMsgs(t, q, 600)

	// Retention deletes segments while readers read them.
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			dst := make([]*ferry.EnhancedMessage, 5)
			for off := int64(0); off < 600; {
				n, err := q.Read(ctx, off, dst)
				if err != nil {
					oldest, _ := q.Offsets()
					if oldest <= off {
						errs <- fmt.Errorf("read at %d, oldest %d: %w", off, oldest, err)
						return
					}
					off = oldest
					continue
				}
				off += int64(n)
			}
		})
	}
	meta := activeMeta
	meta.Retention.MaxMessages = 50
	_, err := st.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{testMsg("x")})
	require.NoError(t, err)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.LessOrEqual(t, st.fds.open(), 3)
}
