package bench

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tinySizes runs every case in seconds, even under the race detector.
func tinySizes(t testing.TB) Sizes {
	s := QuickSizes()
	s.N, s.SlowN, s.LatencyN = 1_000, 300, 300
	s.SyncN, s.SyncProducers, s.SyncProducerN = 20, 8, 5
	s.Dir = t.TempDir()
	return s
}

// TestQuick runs every case of every workload once at tiny sizes: each
// must move all its messages, each exactly once, and leave no goroutine
// behind; the report must hold every row and every target.
func TestQuick(t *testing.T) {
	s := tinySizes(t)
	var progress strings.Builder
	rep, err := Run(context.Background(), s, Options{Runs: 1}, &progress)
	require.NoError(t, err)
	require.Len(t, rep.Results, len(Cases()))
	for _, res := range rep.Results {
		require.NoError(t, res.Errs[0], "w%d %s", res.Workload, res.Name)
		smp := res.Samples[0]
		assert.Equal(t, res.messages(s), smp.Msgs, "w%d %s", res.Workload, res.Name)
		assert.Positive(t, smp.Elapsed, "w%d %s", res.Workload, res.Name)
		if res.Workload == 4 {
			assert.Positive(t, smp.P50, "w%d %s", res.Workload, res.Name)
			assert.LessOrEqual(t, smp.P50, smp.P99, "w%d %s", res.Workload, res.Name)
			assert.LessOrEqual(t, smp.P99, smp.P999, "w%d %s", res.Workload, res.Name)
		}
	}
	assert.Equal(t, len(rep.Results), strings.Count(progress.String(), "\n"))

	ts := rep.Targets()
	require.Len(t, ts, len(targetDefs))
	for _, tg := range ts {
		assert.False(t, math.IsNaN(tg.Value), tg.Text)
	}

	var out strings.Builder
	require.NoError(t, rep.WriteTable(&out))
	for w := 1; w <= 5; w++ {
		assert.Contains(t, out.String(), "Workload "+strconv.Itoa(w)+":")
	}
	for _, res := range rep.Results {
		assert.Contains(t, out.String(), "| "+res.Name+" ")
	}
	assert.Contains(t, out.String(), "Targets")
}

func TestSelect(t *testing.T) {
	cs, err := Select([]int{1}, []string{"chan"})
	require.NoError(t, err)
	var names []string
	for _, c := range cs {
		assert.Equal(t, 1, c.Workload)
		names = append(names, c.Name)
	}
	assert.Equal(t, []string{"ferry", "go chan"}, names, "Ferry's reference case always runs")

	_, err = Select([]int{6}, nil)
	require.ErrorContains(t, err, "no workload 6")
	_, err = Select(nil, []string{"kafka"})
	require.ErrorContains(t, err, `no system "kafka"`)
	_, err = Run(context.Background(), QuickSizes(), Options{Runs: 0}, nil)
	require.ErrorContains(t, err, "0 runs")
	bad := QuickSizes()
	bad.BodyBytes = 4
	_, err = Run(context.Background(), bad, Options{Runs: 1}, nil)
	require.ErrorContains(t, err, "at least 8")
}

func TestCaseNamesUnique(t *testing.T) {
	seen := map[string]bool{}
	refs := map[int]int{}
	for _, c := range Cases() {
		key := strconv.Itoa(c.Workload) + "/" + c.Name
		assert.False(t, seen[key], "duplicate case %s", key)
		seen[key] = true
		if c.Ref {
			refs[c.Workload]++
		}
	}
	for w := 1; w <= 5; w++ {
		assert.Equal(t, 1, refs[w], "workload %d needs exactly one reference case", w)
	}
	for _, d := range targetDefs {
		assert.True(t, seen[strconv.Itoa(d.numW)+"/"+d.num], d.text)
		if !d.alloc {
			assert.True(t, seen[strconv.Itoa(d.denW)+"/"+d.den], d.text)
		}
	}
}

func TestStats(t *testing.T) {
	assert.Equal(t, 2.0, median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, median([]float64{4, 1, 2, 3}))
	assert.True(t, math.IsNaN(median(nil)))

	lat := make([]time.Duration, 1000)
	for i := range lat {
		lat[i] = time.Duration(i + 1)
	}
	assert.Equal(t, time.Duration(500), percentile(lat, 0.5))
	assert.Equal(t, time.Duration(990), percentile(lat, 0.99))
	assert.Equal(t, time.Duration(999), percentile(lat, 0.999))
	assert.Equal(t, time.Duration(0), percentile(nil, 0.5))

	assert.Equal(t, "1,234,567", group(1234567))
	assert.Equal(t, "999", group(999))
	assert.Equal(t, "-1,000", group(-1000))
	assert.Equal(t, "—", group(math.NaN()))

	assert.Equal(t, []int{4, 3, 3}, []int{split(10, 3, 0), split(10, 3, 1), split(10, 3, 2)})
}

// TestRatios checks that ratios are taken within a run before the median.
func TestRatios(t *testing.T) {
	mk := func(w int, name string, ref bool, rates ...float64) *Result {
		r := &Result{Case: Case{Workload: w, Name: name, Ref: ref}}
		for _, x := range rates {
			r.Samples = append(r.Samples, Sample{Msgs: int(x), Elapsed: time.Second, Mallocs: uint64(2 * x)})
			r.Errs = append(r.Errs, nil)
		}
		return r
	}
	rep := &Report{Runs: 3, Results: []*Result{
		mk(1, "ferry", true, 100, 200, 400),
		mk(1, "go chan", false, 200, 100, 800),
	}}
	rows := rep.Rows()
	require.Len(t, rows, 2)
	assert.Equal(t, 200.0, rows[0].Rate)
	assert.Equal(t, 2.0, rows[0].Allocs)
	assert.Equal(t, 1.0, rows[0].VsRef)
	assert.Equal(t, 2.0, rows[1].VsRef, "median of 2, 0.5, 2")
	ts := rep.Targets()
	require.Len(t, ts, 2)
	assert.Equal(t, "W1 Ferry ≥ 0.5× the Go channel", ts[0].Text)
	assert.Equal(t, 0.5, ts[0].Value)
	assert.True(t, ts[0].Met)
	assert.Equal(t, 2.0, ts[1].Value, "allocations per message")
	assert.True(t, ts[1].Met)
}

// BenchmarkCases runs every case with b.N messages, for profiling with
// go test -bench 'Cases/w1/ferry$' -cpuprofile cpu.out. ns/op and
// allocs/op are per message. The latency workload is left out: its time
// is set by the offered rate.
func BenchmarkCases(b *testing.B) {
	for _, c := range Cases() {
		if c.Workload == 4 {
			continue
		}
		b.Run("w"+strconv.Itoa(c.Workload)+"/"+strings.ReplaceAll(c.Name, " ", "_"), func(b *testing.B) {
			s := DefaultSizes()
			s.N, s.SlowN, s.SyncN = b.N, 0, b.N
			s.SyncProducerN = max(1, b.N/s.SyncProducers)
			s.Dir = b.TempDir()
			ctx := context.Background()
			e := newEnv(c, s)
			tr, err := c.setup(ctx, e)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			err = tr.run(ctx)
			b.StopTimer()
			if err := finish(c, e, tr, err); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(e.n)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
