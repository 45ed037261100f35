package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// NATSRatio is one ratio of Ferry's figure to raw nats.go's, per run.
type NATSRatio struct {
	Text   string
	Goal   string // "" when there is none
	Values []float64
}

// Median returns the median over runs.
func (r NATSRatio) Median() float64 { return median(slices.Clone(r.Values)) }

// Ratios returns Ferry's figures over raw nats.go's, each taken within a
// run: time per message (sync; ≤ 1.5 is the goal), rate (batch; ≥ 0.8 on
// R3 against PublishAsync is the goal) and latency percentiles.
func (rep *NATSReport) Ratios() []NATSRatio {
	per := func(a, b NATSCase, f func(x, y NATSSample) float64) []float64 {
		var out []float64
		for i := range rep.Samples[a] {
			if i < len(rep.Samples[b]) {
				out = append(out, f(rep.Samples[a][i], rep.Samples[b][i]))
			}
		}
		return out
	}
	nsRatio := func(x, y NATSSample) float64 { return x.NsPerMsg() / y.NsPerMsg() }
	rateRatio := func(x, y NATSSample) float64 { return x.Rate() / y.Rate() }
	p50 := func(x, y NATSSample) float64 { return float64(x.P50) / float64(y.P50) }
	p99 := func(x, y NATSSample) float64 { return float64(x.P99) / float64(y.P99) }
	var out []NATSRatio
	for _, r := range []int{1, 3} {
		f := func(w string) NATSCase { return NATSCase{r, w, "ferry"} }
		n := func(w string) NATSCase { return NATSCase{r, w, "nats"} }
		out = append(out,
			NATSRatio{fmt.Sprintf("R%d sync: Ferry Send time/msg ÷ js.Publish", r), "≤ 1.5", per(f("sync"), n("sync"), nsRatio)},
			NATSRatio{fmt.Sprintf("R%d batch: Ferry SendBatch rate ÷ PublishAsync", r), map[int]string{1: "", 3: "≥ 0.8"}[r], per(f("batch"), n("batch"), rateRatio)},
			NATSRatio{fmt.Sprintf("R%d batch: Ferry SendBatch rate ÷ atomic PublishMsgBatch", r), "", per(f("batch"), NATSCase{r, "batch", "nats atomic batch"}, rateRatio)},
			NATSRatio{fmt.Sprintf("R%d batch, %d in flight each: Ferry %d senders ÷ PublishAsync", r, asyncWindow, rep.Sizes.Senders()), map[int]string{1: "", 3: "≥ 0.8"}[r],
				per(NATSCase{r, "batch", rep.Sizes.ferrySenders()}, n("batch"), rateRatio)},
			NATSRatio{fmt.Sprintf("R%d batch, %d in flight each: Ferry SendBatch ÷ PublishAsync window=%d", r, rep.Sizes.Batch, rep.Sizes.Batch), "",
				per(f("batch"), NATSCase{r, "batch", rep.Sizes.natsWindow()}, rateRatio)},
			NATSRatio{fmt.Sprintf("R%d one goroutine, %d in flight each: Ferry SendAsync ÷ PublishAsync", r, asyncWindow), map[int]string{1: "", 3: "≥ 0.8"}[r],
				per(NATSCase{r, "batch", ferryAsync}, n("batch"), rateRatio)},
			NATSRatio{fmt.Sprintf("R%d latency p50: Ferry ÷ js.Publish → Consume", r), "≤ 1.5", per(f("latency"), n("latency"), p50)},
			NATSRatio{fmt.Sprintf("R%d latency p99: Ferry ÷ js.Publish → Consume", r), "", per(f("latency"), n("latency"), p99)},
		)
	}
	return out
}

// WriteTable writes the medians of every case and the ratios as markdown.
func (rep *NATSReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	s := rep.Sizes
	fmt.Fprintf(&b, "natsbench: Ferry on natsstore beside raw nats.go, %d run(s) in %v; sync %d msgs, batch %d msgs in batches of %d, latency %d msgs one in flight, %d-byte bodies; medians over runs\n\n",
		s.Runs, rep.Took.Round(time.Millisecond), s.SyncN, s.BatchN, s.Batch, s.LatencyN, s.BodyBytes)
	var rows [][]string
	for _, c := range rep.Cases {
		smps := rep.Samples[c]
		if len(smps) == 0 {
			continue
		}
		med := func(f func(NATSSample) float64) float64 {
			xs := make([]float64, len(smps))
			for i, x := range smps {
				xs[i] = f(x)
			}
			return median(xs)
		}
		row := []string{fmt.Sprintf("R%d", c.Replicas), c.Workload, c.System,
			group(med(NATSSample.Rate)), fmt.Sprintf("%.1f", med(NATSSample.NsPerMsg)/1e3), "", "", ""}
		if c.Workload == "latency" {
			row[5] = micros(time.Duration(med(func(x NATSSample) float64 { return float64(x.P50) })))
			row[6] = micros(time.Duration(med(func(x NATSSample) float64 { return float64(x.P99) })))
			dups := 0
			for _, x := range smps {
				dups += x.Dups
			}
			row[7] = strconv.Itoa(dups)
		}
		rows = append(rows, row)
	}
	writeMarkdown(&b, []string{"servers", "workload", "system", "msgs/s", "µs/msg", "p50 µs", "p99 µs", "handled again (all runs)"}, rows)
	b.WriteString("\nRatios (Ferry ÷ raw nats.go, within each run; median [min–max]); goals are reported, never asserted:\n\n")
	rows = nil
	for _, r := range rep.Ratios() {
		lo, hi := slices.Min(r.Values), slices.Max(r.Values)
		rows = append(rows, []string{r.Text, fmt.Sprintf("%.2f× [%.2f–%.2f]", r.Median(), lo, hi), r.Goal, meets(r)})
	}
	writeMarkdown(&b, []string{"ratio", "value", "goal", "met"}, rows)
	_, err := io.WriteString(w, b.String())
	return err
}

func meets(r NATSRatio) string {
	m := r.Median()
	switch {
	case strings.HasPrefix(r.Goal, "≤ "):
		var g float64
		fmt.Sscanf(strings.TrimPrefix(r.Goal, "≤ "), "%g", &g)
		return map[bool]string{true: "yes", false: "no"}[m <= g]
	case strings.HasPrefix(r.Goal, "≥ "):
		var g float64
		fmt.Sscanf(strings.TrimPrefix(r.Goal, "≥ "), "%g", &g)
		return map[bool]string{true: "yes", false: "no"}[m >= g]
	}
	return ""
}
