package ferry_test

import (
	"errors"
	"testing"

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

func TestKeyHashRouterRoundRobinsEmptyKeys(t *testing.T) {
	r := ferry.KeyHashRouter()
	meta := ferry.TopicMeta{Name: "t", Queues: 4}
	counts := make([]int, 4)
	for range 400 {
		i, err := r.Select(&ferry.EnhancedMessage{}, meta)
		require.NoError(t, err)
		counts[i]++
	}
	assert.Equal(t, []int{100, 100, 100, 100}, counts)
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
