package filestore

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

const slowDiskEnv = "FILESTORE_SLOW_DISK"

// TestConcurrentRetentionOnASlowDisk: ferrytest's ConcurrentRetention
// over a disk whose directory fsyncs take 3 ms each, as they can on a
// loaded machine, passes under a watchdog of 1.5 s. With MaxMessages 8 a
// segment rolls at every message, so the subtest's 300 writes make about
// 1,000 directory fsyncs (a roll syncs the directory after the index
// rename and after the new segment, retention after the deletes; with
// SyncNever too): 3 s at least in all, yet a few milliseconds at most
// between two writes. It failed every time ("made no progress for
// 1.5s") while the subtest did not report its progress to the watchdog,
// as it failed about 3 runs in 15 with the default 10 s on a loaded
// machine. The subtest runs alone, in a child process (-test.run).
func TestConcurrentRetentionOnASlowDisk(t *testing.T) {
	if os.Getenv(slowDiskEnv) != "" {
		slow := func(op, name string) error {
			if op == opSyncDir {
				time.Sleep(3 * time.Millisecond) // the disk modelled, not a wait for an event
			}
			return nil
		}
		f := ferrytest.Features{Persistent: true, Block: true, Dedup: true, Timeout: 1500 * time.Millisecond}
		t.Run("SyncNever", func(t *testing.T) {
			ferrytest.TestQueue(t, f, func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
				st, err := Open(t.TempDir(), WithSync(SyncNever), WithSegmentBytes(4096), WithCache(4, 1<<20), withFault(slow))
				require.NoError(t, err)
				t.Cleanup(func() { _ = st.Close() })
				q, err := st.OpenQueue(t.Context(), meta, queue)
				require.NoError(t, err)
				return q
			})
		})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrentRetentionOnASlowDisk$/^SyncNever$/^ConcurrentRetention$", "-test.v", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), slowDiskEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "ConcurrentRetention on a slow disk:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestConcurrentRetentionOnASlowDisk/SyncNever/ConcurrentRetention")
}
