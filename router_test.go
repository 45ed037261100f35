package ferry_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Kafka's own vectors, from UtilsTest.testMurmur2 in the Java client.
var kafkaMurmur2 = []struct {
	key  string
	hash int32
}{
	{"21", -973932308},
	{"foobar", -790332482},
	{"a-little-bit-long-string", -985981536},
	{"a-little-bit-longer-string", -1486304829},
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
	{"abc", 479470107},
}

func TestMurmur2MatchesKafka(t *testing.T) {
	for _, v := range kafkaMurmur2 {
		assert.Equal(t, v.hash, ferry.Murmur2(v.key), "key %q", v.key)
	}
}

func TestKeyHashRouterIsKafkasDefaultPartitioner(t *testing.T) {
	r := ferry.KeyHashRouter()
	for _, n := range []int{1, 3, 4, 7, 12, 100} {
		for _, v := range kafkaMurmur2 {
			want := int(v.hash&0x7fffffff) % n
			got, err := r.Select(&ferry.EnhancedMessage{Message: ferry.Message{Key: v.key}}, ferry.TopicMeta{Name: "t", Queues: n})
			require.NoError(t, err)
			assert.Equal(t, want, got, "key %q over %d queues", v.key, n)
		}
	}
	// Hand-computed: murmur2("foobar") & 0x7fffffff = 1357151166, % 4 = 2.
	got, _ := r.Select(&ferry.EnhancedMessage{Message: ferry.Message{Key: "foobar"}}, ferry.TopicMeta{Queues: 4})
	assert.Equal(t, 2, got)
}

func TestKeyHashRouterSticksEmptyKeysInRuns(t *testing.T) {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "t", Queues: 4}
	born := time.Now()
	var seq []int
	for i := range 3 * 4 * ferry.DefaultStickyRun {
		// Fast: a microsecond apart, well within DefaultStickyGap.
		m := &ferry.EnhancedMessage{BornUnixNano: born.Add(time.Duration(i) * time.Microsecond).UnixNano()}
		q, err := r.Select(m, meta)
		require.NoError(t, err)
		seq = append(seq, q)
	}
	counts := make([]int, 4)
	for _, q := range seq {
		counts[q]++
	}
	assert.Equal(t, []int{3 * ferry.DefaultStickyRun, 3 * ferry.DefaultStickyRun, 3 * ferry.DefaultStickyRun, 3 * ferry.DefaultStickyRun}, counts)
	// Runs of DefaultStickyRun, each on the queue after the previous run's.
	runs := 0
	for i := 1; i < len(seq); i++ {
		if seq[i] != seq[i-1] {
			assert.Equal(t, (seq[i-1]+1)%4, seq[i], "message %d", i)
			runs++
		}
	}
	assert.GreaterOrEqual(t, runs, 3*4-2) // the first run may be cut short by the start
	assert.LessOrEqual(t, runs, 3*4)
	for i := range seq {
		if i > 0 && seq[i] != seq[i-1] {
			for j := i; j < min(i+ferry.DefaultStickyRun, len(seq)); j++ {
				require.Equal(t, seq[i], seq[j], "a run is %d messages", ferry.DefaultStickyRun)
			}
		}
	}
}

func TestKeyHashRouterRoundRobinsSlowEmptyKeys(t *testing.T) {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "t", Queues: 3}
	born := time.Now()
	var seq []int
	for i := range 9 {
		// Slow: each message more than DefaultStickyGap after the one before.
		m := &ferry.EnhancedMessage{BornUnixNano: born.Add(time.Duration(i) * 2 * ferry.DefaultStickyGap).UnixNano()}
		q, err := r.Select(m, meta)
		require.NoError(t, err)
		seq = append(seq, q)
	}
	for i := 1; i < len(seq); i++ {
		assert.Equal(t, (seq[i-1]+1)%3, seq[i], "message %d of %v", i, seq)
	}
}

// A pause that comes just as a run is full moves to the next queue, not
// the one after it: every queue still gets its share (a watermill test
// saw a queue of four get nothing from 256 keyless messages).
func TestKeyHashRouterPauseAtRunEndSkipsNoQueue(t *testing.T) {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "t", Queues: 4}
	at := time.Now()
	var seq []int
	for run := range 4 {
		if run > 0 {
			at = at.Add(2 * ferry.DefaultStickyGap) // the run is full, then a pause
		}
		for range ferry.DefaultStickyRun {
			at = at.Add(time.Microsecond)
			q, err := r.Select(&ferry.EnhancedMessage{BornUnixNano: at.UnixNano()}, meta)
			require.NoError(t, err)
			seq = append(seq, q)
		}
	}
	counts := make([]int, 4)
	for _, q := range seq {
		counts[q]++
	}
	want := ferry.DefaultStickyRun
	assert.Equal(t, []int{want, want, want, want}, counts)
}

func TestKeyHashRoutersStartOnDifferentQueues(t *testing.T) {
	meta := ferry.TopicMeta{Name: "t", Queues: 8}
	born := time.Now()
	first := func() int {
		q, err := ferry.KeyHashRouter().Select(&ferry.EnhancedMessage{BornUnixNano: born.UnixNano()}, meta)
		require.NoError(t, err)
		return q
	}
	a, b := first(), first()
	assert.Equal(t, (a+1)%8, b, "the router made next starts one queue further")
}

func TestKeyHashRouterConcurrentEmptyKeys(t *testing.T) {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "t", Queues: 5}
	const goroutines, each = 4, 1000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				q, err := r.Select(&ferry.EnhancedMessage{BornUnixNano: time.Now().UnixNano()}, meta)
				assert.NoError(t, err)
				assert.True(t, q >= 0 && q < 5, "queue %d", q)
			}
		})
	}
	wg.Wait()
}

func TestRoundRobinRandomManualRouters(t *testing.T) {
	meta := ferry.TopicMeta{Name: "t", Queues: 3}
	rr := ferry.RoundRobinRouter()
	var seq []int
	for range 6 {
		i, err := rr.Select(&ferry.EnhancedMessage{}, meta)
		require.NoError(t, err)
		seq = append(seq, i)
	}
	assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, seq)

	rnd := ferry.RandomRouter()
	seen := map[int]bool{}
	for range 300 {
		i, err := rnd.Select(&ferry.EnhancedMessage{}, meta)
		require.NoError(t, err)
		require.True(t, i >= 0 && i < 3)
		seen[i] = true
	}
	assert.Len(t, seen, 3)

	i, err := ferry.ManualRouter(2).Select(&ferry.EnhancedMessage{}, meta)
	require.NoError(t, err)
	assert.Equal(t, 2, i)

	boom := errors.New("boom")
	_, err = ferry.RouterFunc(func(*ferry.EnhancedMessage, ferry.TopicMeta) (int, error) { return 0, boom }).Select(nil, meta)
	assert.ErrorIs(t, err, boom)
}

// The sticky run and gap are options of KeyHashRouter.
func TestKeyHashRouterStickyOptions(t *testing.T) {
	meta := ferry.TopicMeta{Name: "t", Queues: 4}
	born := time.Now()
	route := func(r ferry.Router, n int, step time.Duration) []int {
		var seq []int
		for i := range n {
			q, err := r.Select(&ferry.EnhancedMessage{BornUnixNano: born.Add(time.Duration(i) * step).UnixNano()}, meta)
			require.NoError(t, err)
			seq = append(seq, q)
		}
		return seq
	}
	strict := route(ferry.KeyHashRouter(ferry.WithStickyRun(1)), 8, time.Microsecond)
	for i := 1; i < len(strict); i++ {
		assert.Equal(t, (strict[i-1]+1)%4, strict[i], "a run of 1 is round robin: %v", strict)
	}
	runs := route(ferry.KeyHashRouter(ferry.WithStickyRun(3), ferry.WithStickyGap(0)), 12, time.Hour)
	for i := 0; i < 12; i += 3 {
		assert.Equal(t, runs[i], runs[i+1], "no gap cuts a run: %v", runs)
		assert.Equal(t, runs[i], runs[i+2], "runs of 3: %v", runs)
	}
	assert.NotEqual(t, runs[0], runs[3])
}
