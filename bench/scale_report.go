package bench

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ScaleGoal is one of issue 18's goals, checked against a report. Goals
// are reported, never a pass/fail condition.
type ScaleGoal struct {
	Text  string
	Value float64
	// Unit follows Value ("MB", "ms", "×", "B/msg").
	Unit string
	Met  bool
}

// find returns the result of point p, or nil.
func (r *ScaleReport) find(p ScalePoint) *ScaleResult {
	for _, res := range r.Results {
		if res.ScalePoint == p {
			return res
		}
	}
	return nil
}

// med returns the median over the successful runs of res of f; NaN if none.
func (res *ScaleResult) med(f func(ScaleSample) float64) float64 {
	if res == nil {
		return math.NaN()
	}
	var xs []float64
	for i, s := range res.Samples {
		if res.Errs[i] == nil {
			xs = append(xs, f(s))
		}
	}
	return median(xs)
}

// ok returns how many runs of res succeeded, and the first error.
func (res *ScaleResult) ok() (int, error) {
	n := 0
	var first error
	for _, err := range res.Errs {
		if err == nil {
			n++
		} else if first == nil {
			first = err
		}
	}
	return n, first
}

// scaleRatio returns the median over runs where both succeeded of
// f(num)/f(den); NaN if there is none.
func scaleRatio(num, den *ScaleResult, f func(ScaleSample) float64) float64 {
	if num == nil || den == nil {
		return math.NaN()
	}
	var rs []float64
	for i := range num.Samples {
		if i < len(den.Samples) && num.Errs[i] == nil && den.Errs[i] == nil {
			if d := f(den.Samples[i]); d > 0 {
				rs = append(rs, f(num.Samples[i])/d)
			}
		}
	}
	return median(rs)
}

func cpuPerMsg(s ScaleSample) float64 { return s.CPUPerMsg() }
func p50(s ScaleSample) float64       { return float64(s.P50) }
func ms(d time.Duration) float64      { return float64(d) / float64(time.Millisecond) }

// Goals checks issue 18's goals; those whose points did not run are left
// out. The topic goals are taken at the largest topic count measured.
func (r *ScaleReport) Goals() []ScaleGoal {
	var out []ScaleGoal
	add := func(text string, v float64, unit string, want float64) {
		if !math.IsNaN(v) {
			out = append(out, ScaleGoal{Text: text, Value: v, Unit: unit, Met: v <= want})
		}
	}
	if len(r.Sizes.Topics) > 0 {
		top := slices.Max(r.Sizes.Topics)
		big := r.find(ScalePoint{Workload: WorkloadTopics, System: "ferry", Topics: top})
		one := r.find(ScalePoint{Workload: WorkloadTopics, System: "ferry", Topics: 1})
		t := group(float64(top))
		add("W6 Ferry peak RSS at "+t+" topics ≤ 150 MB", big.med(func(s ScaleSample) float64 { return mb(s.PeakRSS) }), "MB", 150)
		add("W6 Ferry creating "+t+" topics and starting their consumers ≤ 100 ms", big.med(func(s ScaleSample) float64 { return ms(s.Setup) }), "ms", 100)
		if top != 1 {
			add("W6 Ferry CPU/msg over "+t+" topics ≤ 2× over 1 topic", scaleRatio(big, one, cpuPerMsg), "×", 2)
		}
	}
	pf, pc := r.find(ScalePoint{Workload: WorkloadPaced, System: "ferry"}), r.find(ScalePoint{Workload: WorkloadPaced, System: "chan"})
	rate := group(float64(r.Sizes.PacedRate))
	add("W7 Ferry CPU/msg at "+rate+" msgs/s ≤ 1.2× the paced channel", scaleRatio(pf, pc, cpuPerMsg), "×", 1.2)
	add("W7 Ferry p50 at "+rate+" msgs/s ≤ 1.5× the paced channel's", scaleRatio(pf, pc, p50), "×", 1.5)
	bl := r.find(ScalePoint{Workload: WorkloadBacklog, System: "ferry"})
	add("W8 Ferry backlog ≤ 120 B/msg beyond the body", bl.med(func(s ScaleSample) float64 { return s.Retained }), "B/msg", 120)
	rb := r.find(ScalePoint{Workload: WorkloadRebalance, System: "ferry"})
	add("W9 a joiner holds its share within 50 ms (median join)", rb.med(func(s ScaleSample) float64 { return ms(s.JoinP50()) }), "ms", 50)
	return out
}

// ScaleTitle describes scale workload w at sizes s.
func ScaleTitle(w int, s ScaleSizes) string {
	switch w {
	case WorkloadTopics:
		return fmt.Sprintf("topics, one consumer each (defaults), %s messages spread over them, idle over %v", group(float64(s.TopicMsgs)), s.Idle)
	case WorkloadPaced:
		return fmt.Sprintf("1 producer → 1 consumer paced at %s msgs/s (sleeping between bursts), %s messages, latency from each send", group(float64(s.PacedRate)), group(float64(s.PacedN)))
	case WorkloadBacklog:
		return fmt.Sprintf("a backlog of %s messages of %d B with no consumer", group(float64(s.BacklogN)), s.BodyBytes)
	case WorkloadRebalance:
		return fmt.Sprintf("a member joins a group owning %d queues while %d workers run CPU-bound handlers, %d joins", s.RebalanceQueues, s.RebalanceWorkers, s.Joins)
	}
	return ""
}

// WriteTable writes the report as Markdown: a table per workload, then
// the goals.
func (r *ScaleReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ferrybench scale: %d runs, medians; %s, %s/%s, GOMAXPROCS %d, %d CPUs; %s; took %v\n",
		r.Runs, r.Started.UTC().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), r.Took.Round(time.Second))
	f1 := func(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
	f0 := func(x float64) string { return group(x) }
	f2 := func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
	heads := map[int][]string{
		WorkloadTopics:    {"system", "topics", "setup ms", "of it topics ms", "peak RSS MB", "RSS after setup MB", "heap in use MB", "stacks MB", "goroutines", "cpu ns/msg", "idle cpu ms/s"},
		WorkloadPaced:     {"system", "msgs", "msgs/s", "cpu ns/msg", "p50 µs", "p99 µs", "p999 µs", "cpu vs chan", "p50 vs chan"},
		WorkloadBacklog:   {"system", "msgs", "B/msg beyond body", "full GC ms", "heap in use MB", "peak RSS MB"},
		WorkloadRebalance: {"system", "queues", "workers", "joins", "join p50 ms", "join max ms", "queues held"},
	}
	for wl := WorkloadTopics; wl <= WorkloadRebalance; wl++ {
		var tab [][]string
		for _, res := range r.Results {
			if res.Workload != wl {
				continue
			}
			name := scaleName(res.ScalePoint)
			ok, err := res.ok()
			if ok == 0 {
				row := make([]string, len(heads[wl]))
				row[0], row[1] = name, "failed: "+firstLine(err)
				tab = append(tab, row)
				continue
			}
			if ok < r.Runs {
				name += fmt.Sprintf(" (%d/%d runs ok)", ok, r.Runs)
			}
			m := res.med
			switch wl {
			case WorkloadTopics:
				tab = append(tab, []string{name, f0(float64(res.Topics)),
					f1(m(func(s ScaleSample) float64 { return ms(s.Setup) })),
					f1(m(func(s ScaleSample) float64 { return ms(s.CreateTopics) })),
					f1(m(func(s ScaleSample) float64 { return mb(s.PeakRSS) })),
					f1(m(func(s ScaleSample) float64 { return mb(s.RSS) })),
					f1(m(func(s ScaleSample) float64 { return mb(s.HeapInuse) })),
					f1(m(func(s ScaleSample) float64 { return mb(s.StackInuse) })),
					f0(m(func(s ScaleSample) float64 { return float64(s.Goroutines) })),
					f0(m(cpuPerMsg)),
					f2(m(ScaleSample.IdleCPUPerSec)),
				})
			case WorkloadPaced:
				chanRes := r.find(ScalePoint{Workload: WorkloadPaced, System: "chan"})
				tab = append(tab, []string{name, f0(m(func(s ScaleSample) float64 { return float64(s.Msgs) })),
					f0(m(func(s ScaleSample) float64 { return float64(s.Msgs) / s.Elapsed.Seconds() })),
					f0(m(cpuPerMsg)),
					f1(m(func(s ScaleSample) float64 { return float64(s.P50) / 1e3 })),
					f1(m(func(s ScaleSample) float64 { return float64(s.P99) / 1e3 })),
					f1(m(func(s ScaleSample) float64 { return float64(s.P999) / 1e3 })),
					times(scaleRatio(res, chanRes, cpuPerMsg)),
					times(scaleRatio(res, chanRes, p50)),
				})
			case WorkloadBacklog:
				tab = append(tab, []string{name, f0(m(func(s ScaleSample) float64 { return float64(s.Msgs) })),
					f1(m(func(s ScaleSample) float64 { return s.Retained })),
					f1(m(func(s ScaleSample) float64 { return ms(s.GC) })),
					f1(m(func(s ScaleSample) float64 { return mb(s.HeapInuse) })),
					f1(m(func(s ScaleSample) float64 { return mb(s.PeakRSS) })),
				})
			case WorkloadRebalance:
				tab = append(tab, []string{name, strconv.Itoa(r.Sizes.RebalanceQueues), strconv.Itoa(r.Sizes.RebalanceWorkers), strconv.Itoa(r.Sizes.Joins),
					f1(m(func(s ScaleSample) float64 { return ms(s.JoinP50()) })),
					f1(m(func(s ScaleSample) float64 { return ms(s.JoinMax()) })),
					f0(m(func(s ScaleSample) float64 { return float64(s.Held) })),
				})
			}
		}
		if len(tab) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nWorkload %d: %s\n\n", wl, ScaleTitle(wl, r.Sizes))
		writeMarkdown(&b, heads[wl], tab)
	}
	if gs := r.Goals(); len(gs) > 0 {
		fmt.Fprintf(&b, "\nIssue 18 goals (reported, never asserted; medians over runs)\n\n")
		var tab [][]string
		for _, g := range gs {
			met := "met"
			if !g.Met {
				met = "NOT met"
			}
			tab = append(tab, []string{g.Text, strconv.FormatFloat(g.Value, 'g', 3, 64) + " " + g.Unit, met})
		}
		writeMarkdown(&b, []string{"goal", "measured", ""}, tab)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// scaleName labels a point's row.
func scaleName(p ScalePoint) string {
	switch p.System {
	case "ferry":
		switch p.Workload {
		case WorkloadPaced:
			return "ferry (bounded queue)"
		case WorkloadBacklog:
			return "ferry (retain all)"
		}
		return "ferry (defaults)"
	case "chan":
		if p.Workload == WorkloadBacklog {
			return "go chan of capacity n"
		}
		return "go chan"
	case "watermill":
		if p.Workload == WorkloadBacklog {
			return "watermill gochannel Persistent"
		}
		return "watermill gochannel"
	case "nats":
		return "nats core"
	}
	return p.System
}

func times(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.3g×", x)
}
