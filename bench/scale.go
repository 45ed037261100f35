package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The scale workloads (issue 18) measure what a load of many topics, a
// steady rate, a deep backlog or a rebalance costs, rather than how fast
// messages move:
//
//  6. topics: T topics on one broker, one consumer each; memory, setup
//     time, CPU per message spread over all topics, idle CPU.
//  7. paced: one producer → one consumer at a steady 100,000 msgs/s; CPU
//     per message and latency from send to handler.
//  8. backlog: M messages kept with no consumer; retained bytes per
//     message beyond its body, and a full GC's duration.
//  9. rebalance: a member joins a group owning 256 queues while 20 workers
//     run CPU-bound handlers; time until it holds its share.
//
// Each point (a workload, a system and, in workload 6, a topic count) is
// measured by [MeasureScale] in the calling process. The command runs
// each point in a child process of its own, so that its memory figures
// are its own.
const (
	WorkloadTopics    = 6
	WorkloadPaced     = 7
	WorkloadBacklog   = 8
	WorkloadRebalance = 9
)

// IsScaleWorkload reports whether w is one of the scale workloads (6–9).
func IsScaleWorkload(w int) bool { return w >= WorkloadTopics && w <= WorkloadRebalance }

// ScaleSizes are the sizes of the scale workloads. Zero values are not
// filled in: start from [DefaultScaleSizes] or [QuickScaleSizes].
type ScaleSizes struct {
	// Topics are the topic counts of workload 6.
	Topics []int
	// TopicMsgs is how many messages workload 6 spreads round robin over
	// the topics, and Idle how long it then measures the CPU of a quiet
	// process (after Settle, for commits and idle workers to retire).
	TopicMsgs    int
	Idle, Settle time.Duration
	// PacedRate and PacedN are workload 7's rate (msgs/s) and messages.
	PacedRate, PacedN int
	// BacklogN is the depth of workload 8's backlog.
	BacklogN int
	// RebalanceQueues, RebalanceWorkers and Joins shape workload 9:
	// the topic's queues, each member's workers, and how many joins are
	// timed. RebalanceBacklog bounds each queue (Overflow Block), so that
	// the producer keeps every queue full without the heap growing.
	RebalanceQueues, RebalanceWorkers, Joins, RebalanceBacklog int
	// RebalanceSpin is the handler's loop count (20,000 is 10–20 µs of
	// CPU, as in the core's BenchmarkRebalanceUnderLoad).
	RebalanceSpin int
	// BodyBytes is the size of every body.
	BodyBytes int
	// Timeout bounds one point.
	Timeout time.Duration
	// OnSetup, if set, is called once a point is set up (after a GC), as
	// its memory figures are read: to write a heap profile, say. It is
	// not a size and is never serialised.
	OnSetup func() `json:"-"`
}

// DefaultScaleSizes returns the sizes of a full run.
func DefaultScaleSizes() ScaleSizes {
	return ScaleSizes{
		Topics: []int{1, 100, 10_000}, TopicMsgs: 200_000, Idle: time.Second, Settle: 500 * time.Millisecond,
		PacedRate: 100_000, PacedN: 500_000,
		BacklogN:        1_000_000,
		RebalanceQueues: 256, RebalanceWorkers: 20, Joins: 20, RebalanceBacklog: 1024, RebalanceSpin: 20_000,
		BodyBytes: 100, Timeout: 3 * time.Minute,
	}
}

// QuickScaleSizes returns sizes that run every point in a few seconds.
func QuickScaleSizes() ScaleSizes {
	s := DefaultScaleSizes()
	s.Topics, s.TopicMsgs, s.Idle, s.Settle = []int{1, 100, 1000}, 20_000, 200*time.Millisecond, 100*time.Millisecond
	s.PacedN = 20_000
	s.BacklogN = 100_000
	s.Joins = 3
	s.Timeout = time.Minute
	return s
}

// Validate reports a size out of range.
func (s ScaleSizes) Validate() error {
	switch {
	case len(s.Topics) == 0 || slices.ContainsFunc(s.Topics, func(t int) bool { return t < 1 }):
		return errors.New("bench: topic counts must be positive")
	case s.TopicMsgs < 1, s.PacedN < 1, s.BacklogN < 1, s.Joins < 1:
		return errors.New("bench: scale message and join counts must be positive")
	case s.PacedRate < 1 || s.PacedRate > 1_000_000_000:
		return fmt.Errorf("bench: paced rate %d not in [1, 1e9]", s.PacedRate)
	case s.RebalanceQueues < 2, s.RebalanceWorkers < 1, s.RebalanceBacklog < 1, s.RebalanceSpin < 0:
		return errors.New("bench: rebalance needs 2 queues or more, and positive workers and backlog")
	case s.BodyBytes < 8:
		return fmt.Errorf("bench: body of %d bytes: at least 8", s.BodyBytes)
	case s.Idle <= 0, s.Settle < 0, s.Timeout <= 0:
		return errors.New("bench: scale durations must be positive")
	}
	return nil
}

// ScalePoint is one measurement of the scale workloads.
type ScalePoint struct {
	Workload int
	System   string
	// Topics is the topic count (workload 6 only).
	Topics int
}

// String returns the point as [ParseScalePoint] reads it:
// "6/ferry/10000", "7/chan".
func (p ScalePoint) String() string {
	s := strconv.Itoa(p.Workload) + "/" + p.System
	if p.Workload == WorkloadTopics {
		s += "/" + strconv.Itoa(p.Topics)
	}
	return s
}

// ParseScalePoint parses what [ScalePoint.String] returns.
func ParseScalePoint(s string) (ScalePoint, error) {
	f := strings.Split(s, "/")
	bad := fmt.Errorf("bench: scale point %q: want workload/system[/topics], as 6/ferry/10000 or 7/chan", s)
	if len(f) < 2 || len(f) > 3 {
		return ScalePoint{}, bad
	}
	w, err := strconv.Atoi(f[0])
	if err != nil {
		return ScalePoint{}, bad
	}
	p := ScalePoint{Workload: w, System: f[1]}
	if len(f) == 3 {
		if p.Topics, err = strconv.Atoi(f[2]); err != nil || p.Topics < 1 {
			return ScalePoint{}, bad
		}
	}
	if scaleFuncs[scaleKey{w, p.System}] == nil || (w == WorkloadTopics) != (len(f) == 3) {
		return ScalePoint{}, bad
	}
	return p, nil
}

// scaleKey names a measuring function.
type scaleKey struct {
	workload int
	system   string
}

// scaleFunc measures one point into smp.
type scaleFunc func(ctx context.Context, s ScaleSizes, p ScalePoint, smp *ScaleSample) error

// scaleFuncs has every point's measurement; scaleSystems the order of the
// systems in each workload (Ferry first).
var (
	scaleFuncs = map[scaleKey]scaleFunc{
		{WorkloadTopics, "ferry"}:      topicsPoint(ferryTopics),
		{WorkloadTopics, "chan"}:       topicsPoint(chanTopics),
		{WorkloadTopics, "watermill"}:  topicsPoint(watermillTopics),
		{WorkloadTopics, "nats"}:       topicsPoint(natsTopics),
		{WorkloadPaced, "ferry"}:       pacedPoint(ferryLatency),
		{WorkloadPaced, "chan"}:        pacedPoint(chanLatency),
		{WorkloadPaced, "nats"}:        pacedPoint(natsCore(false)),
		{WorkloadBacklog, "ferry"}:     backlogPoint(ferryBacklog),
		{WorkloadBacklog, "chan"}:      backlogPoint(chanBacklog),
		{WorkloadBacklog, "watermill"}: backlogPoint(watermillBacklog),
		{WorkloadRebalance, "ferry"}:   rebalancePoint,
	}
	scaleSystems = []string{"ferry", "chan", "watermill", "nats"}
)

// ScalePoints returns the points of the given scale workloads and system
// families (empty: all), Ferry's always included. Workloads outside 6–9
// are left out.
func ScalePoints(s ScaleSizes, workloads []int, systems []string) []ScalePoint {
	var out []ScalePoint
	for w := WorkloadTopics; w <= WorkloadRebalance; w++ {
		if len(workloads) > 0 && !slices.Contains(workloads, w) {
			continue
		}
		for _, sys := range scaleSystems {
			if scaleFuncs[scaleKey{w, sys}] == nil || (sys != "ferry" && len(systems) > 0 && !slices.Contains(systems, sys)) {
				continue
			}
			if w != WorkloadTopics {
				out = append(out, ScalePoint{Workload: w, System: sys})
				continue
			}
			for _, t := range s.Topics {
				out = append(out, ScalePoint{Workload: w, System: sys, Topics: t})
			}
		}
	}
	return out
}

// ScaleSample is one measurement of one point. A figure the point's
// workload does not measure is zero.
type ScaleSample struct {
	// BaseRSS is the process's resident set before the setup, RSS after
	// it (and a GC), PeakRSS its high-water mark (VmHWM) at the end: read
	// from /proc/self/status, zero where there is none.
	BaseRSS, RSS, PeakRSS int64
	// HeapInuse and StackInuse (runtime.MemStats) and Goroutines are
	// read after the setup and a GC.
	HeapInuse, StackInuse int64
	Goroutines            int
	// Setup is the time to create the topics and start their consumers
	// (workload 6); CreateTopics is the part spent creating topics.
	Setup, CreateTopics time.Duration
	// Msgs messages took CPU of process CPU time and Elapsed of wall time
	// (workloads 6 and 7).
	Msgs         int
	CPU, Elapsed time.Duration
	// IdleCPU is the process CPU time over Idle of a quiet process
	// (workload 6).
	IdleCPU, Idle time.Duration
	// P50, P99 and P999 are the latency send → handler (workload 7).
	P50, P99, P999 time.Duration
	// Retained is the heap kept per message of the backlog, beyond its
	// body; GC is the duration of a full runtime.GC with the backlog live
	// (the median of 3) (workload 8).
	Retained float64
	GC       time.Duration
	// Joins are the times a joining member took to hold its share
	// (workload 9); Held the queues it held each time.
	Joins []time.Duration
	Held  int
}

// CPUPerMsg returns CPU ns per message.
func (s ScaleSample) CPUPerMsg() float64 { return float64(s.CPU) / float64(max(1, s.Msgs)) }

// IdleCPUPerSec returns idle CPU in ms per second.
func (s ScaleSample) IdleCPUPerSec() float64 {
	if s.Idle <= 0 {
		return 0
	}
	return float64(s.IdleCPU) / float64(time.Millisecond) / s.Idle.Seconds()
}

// JoinP50 and JoinMax return the median and the longest join.
func (s ScaleSample) JoinP50() time.Duration {
	j := slices.Clone(s.Joins)
	slices.Sort(j)
	return percentile(j, 0.5)
}

func (s ScaleSample) JoinMax() time.Duration {
	if len(s.Joins) == 0 {
		return 0
	}
	return slices.Max(s.Joins)
}

// MeasureScale measures point p once, in this process. Its memory
// figures include whatever else the process holds: the command runs each
// point in a fresh child process.
func MeasureScale(ctx context.Context, s ScaleSizes, p ScalePoint) (ScaleSample, error) {
	if err := s.Validate(); err != nil {
		return ScaleSample{}, err
	}
	f := scaleFuncs[scaleKey{p.Workload, p.System}]
	if f == nil || (p.Workload == WorkloadTopics && p.Topics < 1) {
		return ScaleSample{}, fmt.Errorf("bench: no scale point %v", p)
	}
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	runtime.GC()
	var smp ScaleSample
	smp.BaseRSS, _ = procMem()
	err := f(ctx, s, p, &smp)
	_, smp.PeakRSS = procMem()
	return smp, err
}

// afterSetup records the memory figures of a set-up point, then calls
// s.OnSetup.
func (smp *ScaleSample) afterSetup(s ScaleSizes) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	smp.HeapInuse, smp.StackInuse, smp.Goroutines = int64(m.HeapInuse), int64(m.StackInuse), runtime.NumGoroutine()
	smp.RSS, _ = procMem()
	if s.OnSetup != nil {
		s.OnSetup()
	}
}

// ScaleOptions choose how [RunScale] measures.
type ScaleOptions struct {
	// Runs is how many times every point runs (figures are medians).
	Runs int
	// Points are the points to measure, in order.
	Points []ScalePoint
	// Measure measures one point once; nil means [MeasureScale] in this
	// process.
	Measure func(ctx context.Context, p ScalePoint) (ScaleSample, error)
}

// ScaleResult is every run of one point; Errs[i] is set where run i
// failed.
type ScaleResult struct {
	ScalePoint
	Samples []ScaleSample
	Errs    []error
}

// ScaleReport is the outcome of [RunScale].
type ScaleReport struct {
	Sizes   ScaleSizes
	Runs    int
	Started time.Time
	Took    time.Duration
	Results []*ScaleResult
}

// RunScale measures every point opts.Runs times, the points interleaved
// within each run, writing a line per measurement to progress (if not
// nil). A failed point is recorded in its result and the run goes on.
func RunScale(ctx context.Context, s ScaleSizes, opts ScaleOptions, progress io.Writer) (*ScaleReport, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if opts.Runs < 1 {
		return nil, fmt.Errorf("bench: %d runs: at least 1", opts.Runs)
	}
	if progress == nil {
		progress = io.Discard
	}
	measure := opts.Measure
	if measure == nil {
		measure = func(ctx context.Context, p ScalePoint) (ScaleSample, error) { return MeasureScale(ctx, s, p) }
	}
	rep := &ScaleReport{Sizes: s, Runs: opts.Runs, Started: time.Now()}
	for _, p := range opts.Points {
		rep.Results = append(rep.Results, &ScaleResult{ScalePoint: p, Samples: make([]ScaleSample, opts.Runs), Errs: make([]error, opts.Runs)})
	}
	for r := range opts.Runs {
		for _, res := range rep.Results {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			smp, err := measure(ctx, res.ScalePoint)
			res.Samples[r], res.Errs[r] = smp, err
			if err != nil {
				fmt.Fprintf(progress, "run %d/%d  %-16v FAILED: %v\n", r+1, opts.Runs, res.ScalePoint, err)
				continue
			}
			fmt.Fprintf(progress, "run %d/%d  %-16v %s\n", r+1, opts.Runs, res.ScalePoint, smp.summary(res.Workload))
		}
	}
	rep.Took = time.Since(rep.Started)
	return rep, nil
}

// summary is a progress line's figures.
func (s ScaleSample) summary(w int) string {
	switch w {
	case WorkloadTopics:
		return fmt.Sprintf("setup %v, peak RSS %.1f MB, heap %.1f MB, stacks %.1f MB, %d goroutines, %.0f cpu ns/msg, idle %.2f ms/s",
			s.Setup.Round(time.Microsecond), mb(s.PeakRSS), mb(s.HeapInuse), mb(s.StackInuse), s.Goroutines, s.CPUPerMsg(), s.IdleCPUPerSec())
	case WorkloadPaced:
		return fmt.Sprintf("%.0f cpu ns/msg, p50 %v, p99 %v", s.CPUPerMsg(), s.P50, s.P99)
	case WorkloadBacklog:
		return fmt.Sprintf("%.1f B/msg beyond the body, full GC %v, peak RSS %.1f MB", s.Retained, s.GC.Round(time.Microsecond), mb(s.PeakRSS))
	case WorkloadRebalance:
		return fmt.Sprintf("join p50 %v, max %v, held %d", s.JoinP50().Round(time.Microsecond), s.JoinMax().Round(time.Microsecond), s.Held)
	}
	return ""
}

func mb(b int64) float64 { return float64(b) / 1e6 }
