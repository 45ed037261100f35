package filestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// A full disk right after a roll (the new segment's space reservation
// fails) fails the write and the queue, and leaves files Open accepts
// with every acknowledged message intact: under every policy, for a batch
// that spans the roll and for a single message that starts a segment.
func TestFullDiskAfterRollReopens(t *testing.T) {
	for _, p := range []SyncPolicy{SyncAlways, SyncEvery(time.Hour), SyncNever} {
		for _, batch := range []int{1, 7} {
			t.Run(fmt.Sprintf("%s/batch%d", p, batch), func(t *testing.T) {
				testFullDiskAfterRoll(t, p, batch)
			})
		}
	}
}

func testFullDiskAfterRoll(t *testing.T, p SyncPolicy, batch int) {
	orig := fallocateFile
	var full string // fallocate fails on every segment but this one
	fallocateFile = func(f *os.File, off, n int64) error {
		if full != "" && filepath.Base(f.Name()) != full {
			return &os.PathError{Op: "fallocate", Path: f.Name(), Err: syscall.ENOSPC}
		}
		return orig(f, off, n)
	}
	defer func() { fallocateFile = orig }()

	dir := t.TempDir()
	opts := []Option{WithSync(p), WithSegmentBytes(4 << 10)}
	st, q := openActive(t, dir, opts...)
	acked := 0
	for q.segs[len(q.segs)-1].size < 3<<10 { // most of the first segment
		writeActiveMsgs(t, q, acked, acked+1)
		acked++
	}
	full = filepath.Base(q.segs[len(q.segs)-1].name)
	var err error
	for err == nil {
		msgs := make([]*ferry.EnhancedMessage, batch)
		for i := range msgs {
			msgs[i] = testMsg(activeBody(acked + i))
		}
		_, err = q.Write(context.Background(), msgs)
		if err == nil {
			acked += batch
		}
	}
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, syscall.ENOSPC)
	_, err = q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg("later")})
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, st.Close(), ErrFailed)
	full = ""

	st, q = openActive(t, dir, opts...)
	defer st.Close()
	checkActiveMsgs(t, q, acked)
	writeActiveMsgs(t, q, acked, acked+20)
}
