package ferry_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
	"github.com/ferrymq/ferry/internal/crashtest"
)

// The async crash test re-executes the test binary as a child (the init
// below runs it instead of the tests) that opens a filestore broker
// (SyncAlways) and sends numbered messages with SendAsync from one
// goroutine, up to 256 in flight over 3 queues, printing "ack <n> <queue>
// <offset>" from each successful callback. The parent SIGKILLs it after a
// random number of lines, opens the store and checks: every acknowledged
// message is stored where its report said, and each queue holds, in
// order, a prefix of the messages sent to it (nothing stored that was not
// sent, a send stored only with every earlier one of its queue), so none
// was acknowledged that was not stored. FERRY_ASYNC_CRASH_ROUNDS sets the
// rounds (default 3).

const (
	asyncCrashEnv    = "FERRY_ASYNC_CRASH_CHILD" // the store's directory
	asyncCrashRounds = "FERRY_ASYNC_CRASH_ROUNDS"
	asyncCrashQueues = 3
)

func init() {
	if dir := os.Getenv(asyncCrashEnv); dir != "" {
		asyncCrashChild(dir)
		os.Exit(0)
	}
}

func asyncCrashChild(dir string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	st, err := filestore.Open(dir)
	if err != nil {
		fail(err)
	}
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: crashTopic, Queues: asyncCrashQueues}); err != nil {
		fail(err)
	}
	p, err := b.NewProducer(ferry.WithMaxInFlight(256))
	if err != nil {
		fail(err)
	}
	var mu sync.Mutex
	fmt.Println("ready")
	for i := 0; ; i++ {
		m := &ferry.Message{Topic: crashTopic, Key: strconv.Itoa(i % 11), Body: []byte(strconv.Itoa(i))}
		err := p.SendAsync(ctx, m, func(r ferry.SendResult, err error) {
			if err != nil {
				fail(err)
			}
			mu.Lock()
			fmt.Printf("ack %d %d %d\n", i, r.Queue.Queue, r.Offset)
			mu.Unlock()
		})
		if err != nil {
			fail(err)
		}
	}
}

func TestSendAsyncCrash(t *testing.T) {
	rounds := 3
	if s := os.Getenv(asyncCrashRounds); s != "" {
		var err error
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 30))
	for range rounds {
		asyncCrashRound(t, 200+rng.IntN(5000))
		if t.Failed() {
			return
		}
	}
}

func asyncCrashRound(t *testing.T, lines int) {
	dir := t.TempDir()
	got, stderr, _, err := crashtest.Run([]string{asyncCrashEnv + "=" + dir}, lines)
	require.NoError(t, err)
	require.NotContains(t, stderr, "DATA RACE", "the child")
	require.GreaterOrEqual(t, len(got), lines, "the child stopped early: %s", stderr)
	type at struct {
		queue  int
		offset int64
	}
	acked := map[int]at{}
	for _, l := range got[1:] {
		var n, q int
		var off int64
		_, err := fmt.Sscanf(l, "ack %d %d %d", &n, &q, &off)
		require.NoError(t, err, l)
		acked[n] = at{q, off}
	}

	st, err := filestore.Open(dir)
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	metas, err := st.Topics(t.Context())
	require.NoError(t, err)
	var meta ferry.TopicMeta
	for _, m := range metas {
		if m.Name == crashTopic {
			meta = m
		}
	}
	require.Equal(t, asyncCrashQueues, meta.Queues)
	// The router is deterministic: the queue of key k.
	queueOf := map[int]int{}
	for k := range 11 {
		q, err := ferry.KeyHashRouter().Select(&ferry.EnhancedMessage{Message: ferry.Message{Key: strconv.Itoa(k)}}, meta)
		require.NoError(t, err)
		queueOf[k] = q
	}
	stored := map[int]at{}
	for q := range meta.Queues {
		rq, err := st.OpenQueue(t.Context(), meta, q)
		require.NoError(t, err)
		_, next := rq.Offsets()
		dst := make([]*ferry.EnhancedMessage, 512)
		prev := -1
		for off := int64(0); off < next; {
			n, err := rq.Read(t.Context(), off, dst)
			require.NoError(t, err)
			for _, m := range dst[:n] {
				seq, err := strconv.Atoi(string(m.Body))
				require.NoError(t, err)
				require.Equal(t, queueOf[seq%11], q, "message %d in the wrong queue", seq)
				// A prefix of the queue's sends: the next one sent to it.
				for s := prev + 1; s < seq; s++ {
					if queueOf[s%11] == q {
						require.Failf(t, "a gap", "queue %d stores %d after %d without %d", q, seq, prev, s)
					}
				}
				prev = seq
				stored[seq] = at{q, m.Offset}
			}
			off += int64(n)
		}
		require.NoError(t, rq.Close())
	}
	for n, a := range acked {
		s, ok := stored[n]
		require.True(t, ok, "message %d acknowledged at %v, not stored", n, a)
		require.Equal(t, a, s, "message %d", n)
	}
	assert.GreaterOrEqual(t, len(stored), len(acked))
	t.Logf("%d acknowledged, %d stored (%d written but not yet acknowledged at the kill)", len(acked), len(stored), len(stored)-len(acked))
}
