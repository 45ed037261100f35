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

// Row is the medians over the runs of one case.
type Row struct {
	Workload int
	Name     string
	Ref      bool
	// OK is how many runs succeeded; Err is the first failure.
	OK  int
	Err error
	// Msgs is the messages per run.
	Msgs                              int
	Rate, NsPerMsg, CPUPerMsg, Allocs float64
	P50, P99, P999                    time.Duration
	// VsRef is the median over runs of this case's figure over the
	// reference Ferry case's in the same run: throughput in workloads 1–3
	// and 5, p99 latency in workload 4. NaN where there is none.
	VsRef float64
}

// result returns the result of the named case of workload w, or nil.
func (r *Report) result(w int, name string) *Result {
	for _, res := range r.Results {
		if res.Workload == w && res.Name == name {
			return res
		}
	}
	return nil
}

func (r *Report) ref(w int) *Result {
	for _, res := range r.Results {
		if res.Workload == w && res.Ref {
			return res
		}
	}
	return nil
}

// Rows returns one row per case, in the order the cases ran.
func (r *Report) Rows() []Row {
	var rows []Row
	for _, res := range r.Results {
		row := Row{Workload: res.Workload, Name: res.Name, Ref: res.Ref, VsRef: math.NaN()}
		var rate, ns, cpu, allocs, p50, p99, p999 []float64
		for i, s := range res.Samples {
			if res.Errs[i] != nil {
				row.Err = cmpOr(row.Err, res.Errs[i])
				continue
			}
			row.OK++
			row.Msgs = s.Msgs
			rate = append(rate, s.Rate())
			ns = append(ns, s.NsPerMsg())
			cpu = append(cpu, s.CPUPerMsg())
			allocs = append(allocs, s.AllocsPerMsg())
			p50 = append(p50, float64(s.P50))
			p99 = append(p99, float64(s.P99))
			p999 = append(p999, float64(s.P999))
		}
		row.Rate, row.NsPerMsg, row.CPUPerMsg, row.Allocs = median(rate), median(ns), median(cpu), median(allocs)
		row.P50, row.P99, row.P999 = time.Duration(median(p50)), time.Duration(median(p99)), time.Duration(median(p999))
		if ref := r.ref(res.Workload); ref != nil {
			metric := Sample.Rate
			if res.Workload == 4 {
				metric = func(s Sample) float64 { return float64(s.P99) }
			}
			row.VsRef = ratio(res, ref, metric)
		}
		rows = append(rows, row)
	}
	return rows
}

// ratio returns the median over runs where both succeeded of
// metric(num)/metric(den); NaN if there is no such run.
func ratio(num, den *Result, metric func(Sample) float64) float64 {
	var rs []float64
	for i := range num.Samples {
		if i < len(den.Samples) && num.Errs[i] == nil && den.Errs[i] == nil {
			if d := metric(den.Samples[i]); d > 0 {
				rs = append(rs, metric(num.Samples[i])/d)
			}
		}
	}
	return median(rs)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// Target is one of the targets, checked against a report.
type Target struct {
	Text string
	// Value is the measured ratio (or allocations); Met says whether it
	// holds. Value is NaN when a case it needs did not run.
	Value float64
	Met   bool
	// Want is the bound and Max whether it is an upper bound.
	Want float64
	Max  bool
}

type targetDef struct {
	text         string
	numW, denW   int
	num, den     string
	metric       func(Sample) float64
	want         float64
	upper, alloc bool
}

func p99(s Sample) float64 { return float64(s.P99) }

var targetDefs = []targetDef{
	{text: "W1 Ferry ≥ 0.5× the Go channel", numW: 1, num: "ferry", denW: 1, den: "go chan", metric: Sample.Rate, want: 0.5},
	{text: "W1 Ferry ≥ 20× Watermill GoChannel", numW: 1, num: "ferry", denW: 1, den: "watermill gochannel", metric: Sample.Rate, want: 20},
	{text: "W1 Ferry ≥ 3× NATS core", numW: 1, num: "ferry", denW: 1, den: "nats core", metric: Sample.Rate, want: 3},
	{text: "W1 Ferry ≥ 10× JetStream memory", numW: 1, num: "ferry", denW: 1, den: "jetstream memory", metric: Sample.Rate, want: 10},
	{text: "W1 Ferry ≤ 3 allocations/msg", numW: 1, num: "ferry", want: 3, upper: true, alloc: true},
	{text: "W2 Ferry SendBatch ≥ 0.5× the channel of batches", numW: 2, num: "ferry SendBatch", denW: 2, den: "go chan of batches", metric: Sample.Rate, want: 0.5},
	{text: "W3 Ferry total ≥ Ferry W1", numW: 3, num: "ferry", denW: 1, den: "ferry", metric: Sample.Rate, want: 1},
	{text: "W4 Ferry p99 ≤ 3× the Go channel's p99", numW: 4, num: "ferry", denW: 4, den: "go chan", metric: p99, want: 3, upper: true},
	{text: "W5 Ferry SyncNever ≥ 3× go-diskqueue", numW: 5, num: "ferry SyncNever", denW: 5, den: "diskqueue nsqd defaults", metric: Sample.Rate, want: 3},
	{text: "W5 SyncAlways ×64 producers ≥ 20× one producer", numW: 5, num: "ferry SyncAlways ×64", denW: 5, den: "ferry SyncAlways", metric: Sample.Rate, want: 20},
}

// Targets checks the targets; those whose cases did not run are
// left out.
func (r *Report) Targets() []Target {
	var out []Target
	for _, d := range targetDefs {
		num := r.result(d.numW, d.num)
		if num == nil {
			continue
		}
		var v float64
		if d.alloc {
			var xs []float64
			for i, s := range num.Samples {
				if num.Errs[i] == nil {
					xs = append(xs, s.AllocsPerMsg())
				}
			}
			v = median(xs)
		} else {
			den := r.result(d.denW, d.den)
			if den == nil {
				continue
			}
			v = ratio(num, den, d.metric)
		}
		met := v >= d.want
		if d.upper {
			met = v <= d.want
		}
		out = append(out, Target{Text: d.text, Value: v, Met: met && !math.IsNaN(v), Want: d.want, Max: d.upper})
	}
	return out
}

// WorkloadTitle describes workload w at sizes s.
func WorkloadTitle(w int, s Sizes) string {
	switch w {
	case 1:
		return fmt.Sprintf("1 producer → 1 consumer, 1 queue, %d B bodies", s.BodyBytes)
	case 2:
		return fmt.Sprintf("as 1, batches of %d", s.Batch)
	case 3:
		return fmt.Sprintf("%d producers, %d queues, a group of %d consumers", s.Producers, s.Queues, s.Consumers)
	case 4:
		return fmt.Sprintf("latency publish → handler at %s msgs/s offered, %s messages", group(float64(s.Rate)), group(float64(s.LatencyN)))
	case 5:
		return fmt.Sprintf("durable writes, 1 queue, SyncEvery %v, ×%d producers × %d msgs", s.SyncEvery, s.SyncProducers, s.SyncProducerN)
	}
	return ""
}

// WriteTable writes the report as Markdown: a table per workload, then
// the targets.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ferrybench: %d runs, medians; %s, %s/%s, GOMAXPROCS %d, %d CPUs; %s; took %v\n",
		r.Runs, r.Started.UTC().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), r.Took.Round(time.Second))
	rows := r.Rows()
	for wl := 1; wl <= 5; wl++ {
		var tab [][]string
		for _, row := range rows {
			if row.Workload != wl {
				continue
			}
			vs := "—"
			if !math.IsNaN(row.VsRef) {
				vs = fmt.Sprintf("%.3g×", row.VsRef)
			}
			if row.OK == 0 {
				tab = append(tab, []string{row.Name, "failed: " + firstLine(row.Err), "", "", "", "", "", "", "", ""})
				continue
			}
			name := row.Name
			if row.OK < r.Runs {
				name += fmt.Sprintf(" (%d/%d runs ok)", row.OK, r.Runs)
			}
			lat := []string{"", "", ""}
			if wl == 4 {
				lat = []string{micros(row.P50), micros(row.P99), micros(row.P999)}
			}
			tab = append(tab, append([]string{name, group(float64(row.Msgs)), group(row.Rate), fmt.Sprintf("%.0f", row.NsPerMsg), fmt.Sprintf("%.0f", row.CPUPerMsg), fmt.Sprintf("%.2f", row.Allocs)}, append(lat, vs)...))
		}
		if len(tab) == 0 {
			continue
		}
		vsHead := "msgs/s vs ferry"
		if wl == 4 {
			vsHead = "p99 vs ferry"
		}
		fmt.Fprintf(&b, "\nWorkload %d: %s\n\n", wl, WorkloadTitle(wl, r.Sizes))
		writeMarkdown(&b, []string{"system", "msgs", "msgs/s", "ns/msg", "cpu ns/msg", "allocs/msg", "p50 µs", "p99 µs", "p999 µs", vsHead}, tab)
	}
	if ts := r.Targets(); len(ts) > 0 {
		fmt.Fprintf(&b, "\nTargets (ratios within each run, median over runs)\n\n")
		var tab [][]string
		for _, t := range ts {
			met := "met"
			if !t.Met {
				met = "NOT met"
			}
			tab = append(tab, []string{t.Text, fmt.Sprintf("%.3g", t.Value), met})
		}
		writeMarkdown(&b, []string{"target", "measured", ""}, tab)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func firstLine(err error) string {
	if err == nil {
		return ""
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

func micros(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64)
}

// group formats x rounded to an integer with thousands separators.
func group(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// writeMarkdown writes a Markdown table with padded columns; the first
// column is left-aligned, the others right-aligned.
func writeMarkdown(b *strings.Builder, head []string, rows [][]string) {
	width := make([]int, len(head))
	for _, r := range append([][]string{head}, rows...) {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(r []string) {
		b.WriteString("|")
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i == 0 {
				fmt.Fprintf(b, " %s%s |", c, pad)
			} else {
				fmt.Fprintf(b, " %s%s |", pad, c)
			}
		}
		b.WriteString("\n")
	}
	line(head)
	b.WriteString("|")
	for i, wd := range width {
		if i == 0 {
			b.WriteString(" " + strings.Repeat("-", wd) + " |")
		} else {
			b.WriteString(" " + strings.Repeat("-", wd-1) + ": |")
		}
	}
	b.WriteString("\n")
	for _, r := range rows {
		line(r)
	}
}
