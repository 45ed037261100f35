package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyScaleSizes runs every scale point in seconds, even under the race
// detector.
func tinyScaleSizes() ScaleSizes {
	s := QuickScaleSizes()
	s.Topics, s.TopicMsgs = []int{1, 50}, 2_000
	s.Idle, s.Settle = 20*time.Millisecond, 10*time.Millisecond
	s.PacedN, s.BacklogN = 2_000, 5_000
	s.RebalanceQueues, s.Joins, s.RebalanceSpin = 16, 2, 1_000
	return s
}

// TestScaleQuick runs every scale point once in this process: each must
// move all its messages, each exactly once (the points check), and leave
// no goroutine behind (TestMain); the report must hold every row and
// every goal.
func TestScaleQuick(t *testing.T) {
	s := tinyScaleSizes()
	points := ScalePoints(s, nil, nil)
	require.Len(t, points, len(scaleFuncs)+(len(s.Topics)-1)*len(scaleSystems)) // a topic point per count for each system
	var progress strings.Builder
	rep, err := RunScale(context.Background(), s, ScaleOptions{Runs: 1, Points: points}, &progress)
	require.NoError(t, err)
	for _, res := range rep.Results {
		require.NoError(t, res.Errs[0], "%v", res.ScalePoint)
		smp := res.Samples[0]
		switch res.Workload {
		case WorkloadTopics:
			assert.Equal(t, s.TopicMsgs, smp.Msgs, "%v", res.ScalePoint)
			assert.Positive(t, smp.Setup, "%v", res.ScalePoint)
			assert.GreaterOrEqual(t, smp.Idle, s.Idle, "%v", res.ScalePoint)
			if res.System == "ferry" {
				// Idle consumers on memory queues park no goroutine.
				assert.Less(t, smp.Goroutines, 10, "%v: goroutines of idle consumers", res.ScalePoint)
			} else {
				assert.GreaterOrEqual(t, smp.Goroutines, res.Topics, "%v: a consumer per topic", res.ScalePoint)
			}
		case WorkloadPaced:
			assert.Equal(t, s.PacedN, smp.Msgs, "%v", res.ScalePoint)
			assert.Positive(t, smp.P50, "%v", res.ScalePoint)
			assert.LessOrEqual(t, smp.P50, smp.P99, "%v", res.ScalePoint)
		case WorkloadBacklog:
			assert.Equal(t, s.BacklogN, smp.Msgs, "%v", res.ScalePoint)
			assert.Positive(t, smp.Retained, "%v", res.ScalePoint)
		case WorkloadRebalance:
			assert.Len(t, smp.Joins, s.Joins)
			assert.Equal(t, s.RebalanceQueues/2, smp.Held)
		}
	}
	assert.Equal(t, len(points), strings.Count(progress.String(), "\n"))
	assert.Len(t, rep.Goals(), 7)

	var out strings.Builder
	require.NoError(t, rep.WriteTable(&out))
	for w := WorkloadTopics; w <= WorkloadRebalance; w++ {
		assert.Contains(t, out.String(), ScaleTitle(w, s))
	}
	assert.Contains(t, out.String(), "Issue 18 goals")
}

func TestScalePointString(t *testing.T) {
	for _, p := range ScalePoints(DefaultScaleSizes(), nil, nil) {
		q, err := ParseScalePoint(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, q)
	}
	for _, bad := range []string{"", "6/ferry", "7/ferry/10", "6/ferry/0", "6/kafka/10", "x/ferry", "9/chan", "1/ferry"} {
		_, err := ParseScalePoint(bad)
		assert.Error(t, err, bad)
	}
}

func TestScaleSelect(t *testing.T) {
	s := DefaultScaleSizes()
	ps := ScalePoints(s, []int{WorkloadPaced, 1}, []string{"chan"})
	assert.Equal(t, []ScalePoint{{Workload: WorkloadPaced, System: "ferry"}, {Workload: WorkloadPaced, System: "chan"}}, ps)
	assert.Empty(t, ScalePoints(s, []int{1, 2}, nil))
}
