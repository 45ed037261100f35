package filestore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
	"github.com/ferrymq/ferry/internal/crashtest"
)

// The crash test re-executes the test binary as a child that writes from
// several goroutines and prints every acknowledged message; the parent
// kills it with SIGKILL after a random number of acknowledgements, reopens
// the store and checks that every acknowledged message is there, intact,
// in order, at contiguous offsets, and that the cursor is at least the
// last one acknowledged (-1, none, until one is; the first kill lands at
// once, before any can be). It runs under SyncAlways and under SyncNever,
// whose acknowledged writes must survive a crash of the process too (the
// killed child leaves the active segment mapped, with space reserved
// after its last frame); SyncNever acknowledges cursor commits before
// writing them, so only SyncAlways checks the cursor.

const (
	crashChildEnv = "FILESTORE_CRASH_CHILD"
	crashSyncEnv  = "FILESTORE_CRASH_SYNC" // "never" for SyncNever
)

var crashMeta = ferry.TopicMeta{Name: "crash", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}

func crashOptions(never bool) []filestore.Option {
	p := filestore.SyncAlways
	if never {
		p = filestore.SyncNever
	}
	return []filestore.Option{filestore.WithSync(p), filestore.WithSegmentBytes(16 << 10), filestore.WithCache(16, 1<<20)}
}

func crashBody(w, seq int) string {
	return fmt.Sprintf("w%d-s%d-%s", w, seq, strings.Repeat("x", (w*7+seq)%50))
}

func crashChild() {
	ctx := context.Background()
	st, err := filestore.Open(os.Getenv(crashChildEnv), crashOptions(os.Getenv(crashSyncEnv) == "never")...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	q, err := st.OpenQueue(ctx, crashMeta, 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var mu sync.Mutex // serializes lines on stdout
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = os.Stdout.WriteString(s)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				n := 1 + seq%3
				batch := make([]*ferry.EnhancedMessage, n)
				for i := range batch {
					batch[i] = &ferry.EnhancedMessage{Message: ferry.Message{Topic: crashMeta.Name, Body: []byte(crashBody(w, seq*3+i))}}
				}
				first, err := q.Write(ctx, batch)
				if err != nil {
					say(fmt.Sprintln("error", err))
					os.Exit(1)
				}
				var b strings.Builder
				for i, m := range batch {
					fmt.Fprintf(&b, "ack %d %s\n", first+int64(i), m.Body)
				}
				say(b.String())
				if w == 0 {
					if err := st.Commit(ctx, crashMeta.Name, "g", 0, first+int64(n)); err != nil {
						say(fmt.Sprintln("error", err))
						os.Exit(1)
					}
					say(fmt.Sprintf("cursor %d\n", first+int64(n)))
				}
			}
		})
	}
	wg.Wait()
}

func TestCrashRecovery(t *testing.T) {
	t.Run("SyncAlways", func(t *testing.T) { testCrashRecovery(t, false) })
	t.Run("SyncNever", func(t *testing.T) { testCrashRecovery(t, true) })
}

func testCrashRecovery(t *testing.T, never bool) {
	kills := 20
	if testing.Short() {
		kills = 5
	}
	dir := t.TempDir()
	acked := map[int64]string{}
	cursor := int64(-1) // the highest acknowledged cursor; -1 (none) until the child reports one
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 7))
	for k := range kills {
		target := rng.IntN(400) // 0: kill at once, maybe during recovery
		if k == 0 {
			target = 0 // at once, before the child can acknowledge a cursor
		}
		env := []string{crashChildEnv + "=" + dir}
		if never {
			env = append(env, crashSyncEnv+"=never")
		}
		got, stderr, _, err := crashtest.Run(env, target)
		require.NoError(t, err)
		require.NotContains(t, stderr, "DATA RACE", "the child")
		for _, l := range got {
			f := strings.Fields(l)
			switch f[0] {
			case "ack":
				off, err := strconv.ParseInt(f[1], 10, 64)
				require.NoError(t, err)
				acked[off] = f[2]
			case "cursor":
				c, err := strconv.ParseInt(f[1], 10, 64)
				require.NoError(t, err)
				cursor = max(cursor, c)
			default:
				t.Fatalf("kill %d: child said %q", k, l)
			}
		}
		if never {
			cursor = -1 // not checked: see above
		}
		checkCrashDir(t, dir, acked, cursor, never)
	}
	t.Logf("%d kills, %d acknowledged messages", kills, len(acked))
}

func checkCrashDir(t *testing.T, dir string, acked map[int64]string, cursor int64, never bool) {
	t.Helper()
	ctx := context.Background()
	st, err := filestore.Open(dir, crashOptions(never)...)
	require.NoError(t, err)
	defer st.Close()
	q, err := st.OpenQueue(ctx, crashMeta, 0)
	require.NoError(t, err)
	oldest, next := q.Offsets()
	require.Equal(t, int64(0), oldest)
	all := readAll(t, q, 0)
	require.Len(t, all, int(next))
	for i, m := range all {
		require.Equal(t, int64(i), m.Offset, "contiguous offsets")
		if want, ok := acked[m.Offset]; ok {
			require.Equal(t, want, string(m.Body), "offset %d", m.Offset)
		}
	}
	for off := range acked {
		require.Less(t, off, next, "acknowledged offset %d lost", off)
	}
	got, err := st.Load(ctx, crashMeta.Name, "g", 1)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, got[0], cursor, "acknowledged cursor lost")
	assert.LessOrEqual(t, got[0], next)
}
