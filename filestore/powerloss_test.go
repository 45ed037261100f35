package filestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// TestSimulatedPowerLoss checks SyncAlways against a crash that loses
// what was not fdatasynced, which a SIGKILL (the page cache survives)
// cannot show. While writers run, it freezes at a random moment the set of
// acknowledged messages and the length of the frames each segment had at
// its last fdatasync (a mapped segment's file is longer: space reserved); after the run it cuts every segment back to that length,
// removes segments created later and appends zeros or garbage to the
// newest, as a power loss can leave it. Every message acknowledged before
// the freeze must come back intact.
func TestSimulatedPowerLoss(t *testing.T) {
	rounds := 6
	if testing.Short() {
		rounds = 2
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range rounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			var mu sync.Mutex // guards synced, acked, frozen, frozenSynced, frozenAcked
			synced := map[string]int64{}
			acked := map[int64]string{}
			var frozen bool
			var frozenSynced map[string]int64
			var frozenAcked map[int64]string

			orig := syncFile
			syncFile = func(f *os.File) error {
				if err := orig(f); err != nil {
					return err
				}
				if strings.HasSuffix(f.Name(), ".log") {
					fi, err := f.Stat()
					if err != nil {
						return err
					}
					n := framesEnd(f, fi.Size())
					mu.Lock()
					synced[filepath.Base(f.Name())] = n
					mu.Unlock()
				}
				return nil
			}
			defer func() { syncFile = orig }()

			dir := t.TempDir()
			opts := []Option{WithSync(SyncAlways), WithSegmentBytes(8 << 10)}
			st, err := Open(dir, opts...)
			require.NoError(t, err)
			meta := ferry.TopicMeta{Name: "p", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}
			q, err := st.OpenQueue(context.Background(), meta, 0)
			require.NoError(t, err)
			freezeAt := 50 + rng.IntN(400)
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					for i := range 80 {
						body := fmt.Sprintf("w%d-%d-%s", w, i, strings.Repeat("z", i%40))
						first, err := q.Write(context.Background(), []*ferry.EnhancedMessage{testMsg(body)})
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						acked[first] = body
						if !frozen && len(acked) >= freezeAt {
							frozen = true
							frozenSynced = make(map[string]int64, len(synced))
							for k, v := range synced {
								frozenSynced[k] = v
							}
							frozenAcked = make(map[int64]string, len(acked))
							for k, v := range acked {
								frozenAcked[k] = v
							}
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			require.NoError(t, st.Close())
			require.True(t, frozen)

			// The power loss.
			qdir := filepath.Join(dir, "topics", "p", "0")
			segs, err := filepath.Glob(filepath.Join(qdir, "*.log"))
			require.NoError(t, err)
			var kept []string
			for _, s := range segs {
				n, ok := frozenSynced[filepath.Base(s)]
				if !ok {
					if filepath.Base(s) != "00000000000000000000.log" {
						require.NoError(t, os.Remove(s)) // created after the freeze
						continue
					}
					n = 0
				}
				require.NoError(t, os.Truncate(s, n))
				kept = append(kept, s)
			}
			newest := kept[len(kept)-1]
			tail := make([]byte, rng.IntN(3000))
			if rng.IntN(2) == 0 {
				for i := range tail {
					tail[i] = byte(rng.IntN(256))
				}
			}
			f, err := os.OpenFile(newest, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.Write(tail)
			require.NoError(t, err)
			require.NoError(t, f.Close())

			st, err = Open(dir, opts...)
			require.NoError(t, err)
			defer st.Close()
			q, err = st.OpenQueue(context.Background(), meta, 0)
			require.NoError(t, err)
			_, next := q.Offsets()
			got := map[int64]string{}
			dst := make([]*ferry.EnhancedMessage, 32)
			for off := int64(0); off < next; {
				n, err := q.Read(context.Background(), off, dst)
				require.NoError(t, err)
				for _, m := range dst[:n] {
					require.Equal(t, off, m.Offset)
					got[off] = string(m.Body)
					off++
				}
			}
			for off, body := range frozenAcked {
				require.Equal(t, body, got[off], "message %d acknowledged before the power loss", off)
			}
			t.Logf("freeze after %d acks: %d acknowledged then, %d recovered", freezeAt, len(frozenAcked), next)
		})
	}
}

// framesEnd returns the length of the whole frames at the start of f, of
// size bytes: the file's length unless space is reserved after them. It
// checks lengths and checksums, whatever queue the frames carry.
func framesEnd(f *os.File, size int64) int64 {
	var pos int64
	for pos+framePrefix <= size {
		var p [framePrefix]byte
		if _, err := f.ReadAt(p[:], pos); err != nil {
			return pos
		}
		n, err := frameLen(p[:], DefaultMaxFrameBytes, size-pos)
		if err != nil {
			return pos
		}
		b := make([]byte, n)
		if _, err := f.ReadAt(b, pos); err != nil {
			return pos
		}
		if _, _, err := decodeFrame(b, DefaultMaxFrameBytes, frameKey{}); err != nil && !errors.Is(err, errMisplaced) {
			return pos
		}
		pos += int64(n)
	}
	return pos
}
