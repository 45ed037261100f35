package filestore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
	"github.com/ferrymq/ferry/internal/crashtest"
)

func keyed(topic, key, body string) *ferry.EnhancedMessage {
	return &ferry.EnhancedMessage{Message: ferry.Message{Topic: topic, DedupKey: key, Body: []byte(body)}, ID: ferry.NewMessageID(time.Now())}
}

// write writes msgs and returns which were duplicates.
func writeDups(t *testing.T, q ferry.Queue, msgs ...*ferry.EnhancedMessage) []bool {
	t.Helper()
	first, err := q.Write(context.Background(), msgs)
	require.NoError(t, err)
	dup := make([]bool, len(msgs))
	ferry.Duplicates(first, msgs, func(i int) { dup[i] = true })
	return dup
}

func TestDedupSurvivesReopen(t *testing.T) {
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncNever} {
		t.Run(p.String(), func(t *testing.T) {
			dir := t.TempDir()
			meta := ferry.TopicMeta{Name: "t", Queues: 1}
			opts := []filestore.Option{filestore.WithSync(p), filestore.WithSegmentBytes(4096), filestore.WithCache(4, 1<<20)}
			st, err := filestore.Open(dir, opts...)
			require.NoError(t, err)
			q := openQueue(t, st, meta, 0)
			assert.Equal(t, ferry.DefaultDedupWindow, q.(ferry.Deduplicator).DedupWindow())
			a := keyed("t", "a", "first a")
			assert.Equal(t, []bool{false, false, true, false}, writeDups(t, q, a, keyed("t", "b", "b"), keyed("t", "a", "a again"), keyed("t", "", "no key")))
			// Enough messages to span segments, so the rebuild reads sealed ones.
			for i := range 100 {
				assert.Equal(t, []bool{false}, writeDups(t, q, keyed("t", fmt.Sprint("n", i), strings.Repeat("x", 100))))
			}
			_, next := q.Offsets()
			require.NoError(t, st.Close())

			st = open(t, dir, opts...)
			q = openQueue(t, st, meta, 0)
			again := keyed("t", "a", "a after reopen")
			n0 := keyed("t", "n0", "")
			n99 := keyed("t", "n99", "")
			assert.Equal(t, []bool{true, true, true, false}, writeDups(t, q, again, n0, n99, keyed("t", "c", "new")))
			assert.Equal(t, a.ID, again.ID)
			assert.Equal(t, a.Offset, again.Offset)
			assert.Equal(t, a.StoreUnixNano, again.StoreUnixNano)
			assert.EqualValues(t, 3, n0.Offset)
			assert.EqualValues(t, 102, n99.Offset)
			_, after := q.Offsets()
			assert.Equal(t, next+1, after, "only c was stored")
			got := readAll(t, q, 0)
			assert.Equal(t, "first a", string(got[0].Body))
			assert.Equal(t, "a", got[0].DedupKey, "the key is stored with the message")

			// A window switched off is off; switched on again it is
			// rebuilt from the files.
			q = openQueue(t, st, ferry.TopicMeta{Name: "t", Queues: 1, DedupWindow: ferry.DedupOff}, 0)
			assert.Zero(t, q.(ferry.Deduplicator).DedupWindow())
			assert.Equal(t, []bool{false}, writeDups(t, q, keyed("t", "a", "stored, dedup off")))
			q = openQueue(t, st, meta, 0)
			assert.Equal(t, []bool{true}, writeDups(t, q, keyed("t", "b", "")))
		})
	}
}

func TestDedupWindowSavedWithTopic(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := filestore.Open(dir)
	require.NoError(t, err)
	meta := ferry.TopicMeta{Name: "t", Queues: 1, DedupWindow: 5 * time.Second}
	require.NoError(t, st.CreateTopic(ctx, meta))
	require.NoError(t, st.CreateTopic(ctx, ferry.TopicMeta{Name: "off", Queues: 1, DedupWindow: ferry.DedupOff}))
	require.NoError(t, st.CreateTopic(ctx, ferry.TopicMeta{Name: "default", Queues: 1}))
	require.NoError(t, st.Close())
	st = open(t, dir)
	got, err := st.Topic(ctx, "t")
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, got.DedupWindow)
	got, err = st.Topic(ctx, "off")
	require.NoError(t, err)
	assert.Equal(t, ferry.DedupOff, got.DedupWindow)
	got, err = st.Topic(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, ferry.DefaultDedupWindow, got.DedupWindow)
	assert.ErrorIs(t, st.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}), ferry.ErrTopicExists, "another window is other metadata")
	assert.ErrorIs(t, st.CreateTopic(ctx, ferry.TopicMeta{Name: "bad", Queues: 1, DedupWindow: -3}), ferry.ErrInvalidOption)
}

// Writers sharing group commits (SyncAlways) with the same keys: each key
// is stored once, and every write's report tells its duplicates.
func TestDedupConcurrentWriters(t *testing.T) {
	st := open(t, t.TempDir())
	q := openQueue(t, st, ferry.TopicMeta{Name: "t", Queues: 1}, 0)
	const writers, keys = 8, 200
	var mu sync.Mutex
	stored := map[string][]int64{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := 0; i < keys; i += 2 {
				batch := []*ferry.EnhancedMessage{keyed("t", fmt.Sprint("k", i), fmt.Sprint(w)), keyed("t", fmt.Sprint("k", i+1), fmt.Sprint(w))}
				first, err := q.Write(context.Background(), batch)
				if !assert.NoError(t, err) {
					return
				}
				dup := map[int]bool{}
				ferry.Duplicates(first, batch, func(i int) { dup[i] = true })
				mu.Lock()
				for j, m := range batch {
					if !dup[j] {
						stored[m.DedupKey] = append(stored[m.DedupKey], m.Offset)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Len(t, stored, keys)
	for k, offs := range stored {
		assert.Len(t, offs, 1, "key %s", k)
	}
	_, next := q.Offsets()
	assert.EqualValues(t, keys, next)
	seen := map[string]bool{}
	for _, m := range readAll(t, q, 0) {
		assert.False(t, seen[m.DedupKey], "key %s stored twice", m.DedupKey)
		seen[m.DedupKey] = true
		assert.Equal(t, []int64{m.Offset}, stored[m.DedupKey])
	}
}

// The crash test of deduplication: a child writes keys k0, k1, ... in
// order, each twice, printing what each write reported; it is killed at
// random and started again, writing from k0 again. After every kill the
// parent checks that no key is stored twice, that every acknowledged key
// is where its write said, and that the keys the restarted child wrote
// again were reported as duplicates of the first ones (the window was
// rebuilt from the files).

const dedupChildEnv = "FILESTORE_DEDUP_CHILD"

func dedupChild() {
	ctx := context.Background()
	st, err := filestore.Open(os.Getenv(dedupChildEnv), crashOptions(os.Getenv(crashSyncEnv) == "never")...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	q, err := st.OpenQueue(ctx, crashMeta, 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for i := 0; ; i++ {
		k := "k" + strconv.Itoa(i)
		batch := []*ferry.EnhancedMessage{keyed(crashMeta.Name, k, k), keyed(crashMeta.Name, k, k+" again")}
		first, err := q.Write(ctx, batch)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		dup := []string{"new", "new"}
		ferry.Duplicates(first, batch, func(i int) { dup[i] = "dup" })
		fmt.Printf("ack %s %d %s %d %s\n", k, batch[0].Offset, dup[0], batch[1].Offset, dup[1])
	}
}

func TestDedupCrashRecovery(t *testing.T) {
	t.Run("SyncAlways", func(t *testing.T) { testDedupCrash(t, false) })
	t.Run("SyncNever", func(t *testing.T) { testDedupCrash(t, true) })
}

func testDedupCrash(t *testing.T, never bool) {
	dir := t.TempDir()
	acked := map[string]int64{} // key: its offset, as first acknowledged
	for k := range 5 {
		env := []string{dedupChildEnv + "=" + dir}
		if never {
			env = append(env, crashSyncEnv+"=never")
		}
		got, stderr, _, err := crashtest.Run(env, 20+k*37)
		require.NoError(t, err)
		require.NotContains(t, stderr, "DATA RACE", "the child")
		for _, l := range got {
			f := strings.Fields(l)
			require.Equal(t, "ack", f[0], "kill %d: child said %q", k, l)
			off0, _ := strconv.ParseInt(f[2], 10, 64)
			off1, _ := strconv.ParseInt(f[4], 10, 64)
			assert.Equal(t, off0, off1, "kill %d: %s twice in a batch: one offset", k, f[1])
			assert.Equal(t, "dup", f[5], "kill %d: the second %s of a batch is a duplicate", k, f[1])
			if have, ok := acked[f[1]]; ok {
				assert.Equal(t, "dup", f[3], "kill %d: %s written again after a restart: a duplicate", k, f[1])
				assert.Equal(t, have, off0, "kill %d: %s reported where it was first stored", k, f[1])
			} else {
				acked[f[1]] = off0
			}
		}
		st, err := filestore.Open(dir, crashOptions(never)...)
		require.NoError(t, err)
		q, err := st.OpenQueue(context.Background(), crashMeta, 0)
		require.NoError(t, err)
		seen := map[string]int64{}
		for _, m := range readAll(t, q, 0) {
			_, twice := seen[m.DedupKey]
			require.False(t, twice, "kill %d: key %s stored twice", k, m.DedupKey)
			seen[m.DedupKey] = m.Offset
			assert.Equal(t, m.DedupKey, string(m.Body), "the first of the batch is the one stored")
		}
		for key, off := range acked {
			assert.Equal(t, off, seen[key], "kill %d: acknowledged %s", k, key)
		}
		require.NoError(t, st.Close())
	}
	t.Logf("%d keys acknowledged", len(acked))
}
