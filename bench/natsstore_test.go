package bench

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNATSQuick runs every natsbench case once at tiny sizes, so that
// cmd/natsbench cannot rot: every case must finish, every ratio be a
// number and the table hold every row. The figures are not checked.
func TestNATSQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: NATS servers and a 3-node cluster")
	}
	s := QuickNATSSizes()
	s.SyncN, s.BatchN, s.LatencyN = 50, 500, 50
	var progress strings.Builder
	rep, err := RunNATS(context.Background(), s, &progress)
	require.NoError(t, err)
	for _, c := range rep.Cases {
		require.Len(t, rep.Samples[c], 1, "%+v", c)
		assert.Positive(t, rep.Samples[c][0].Elapsed, "%+v", c)
		if c.Workload == "latency" {
			assert.LessOrEqual(t, rep.Samples[c][0].P50, rep.Samples[c][0].P99, "%+v", c)
		}
	}
	for _, r := range rep.Ratios() {
		assert.False(t, math.IsNaN(r.Median()), r.Text)
	}
	var out strings.Builder
	require.NoError(t, rep.WriteTable(&out))
	assert.Equal(t, len(rep.Cases), strings.Count(progress.String(), "\n"))
	assert.Contains(t, out.String(), "R3 batch: Ferry SendBatch rate ÷ PublishAsync")
}
