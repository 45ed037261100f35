// Command ferrybench measures Ferry and the systems users would pick
// instead (a Go channel, Watermill's GoChannel, NATS core and JetStream
// embedded, go-diskqueue) on the same workloads in one run, and prints a
// table of throughput, ns/msg, allocations/msg, latency percentiles and
// each peer's ratio to Ferry, then the project's targets. The scale
// workloads 6–9 (many topics, a paced rate, a deep backlog, a rebalance
// under load) follow, each point in a child process of its own (this
// binary, run with -point), then issue 18's goals.
//
// Usage:
//
//	go run ./cmd/ferrybench                  # full run: 1M messages, 5 runs; scale points 3 runs
//	go run ./cmd/ferrybench -quick           # tiny sizes, 1 run, seconds
//	go run ./cmd/ferrybench -workloads 1,4 -systems ferry,chan -runs 7
//	go run ./cmd/ferrybench -workloads 6,7,8,9 -scale-runs 2
//	go run ./cmd/ferrybench -point 6/ferry/10000 -cpuprofile cpu.out -memprofile mem.out
//
// Every figure is a median over -runs; every ratio is taken within a run,
// then the median. The command exits with status 1 if a case or a point
// failed (a lost message, an error), never because of a figure. See
// README.md.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ferrybench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := false
	for _, a := range os.Args[1:] {
		if a == "-quick" || a == "--quick" || a == "-quick=true" || a == "--quick=true" {
			quick = true
		}
	}
	s, runs := bench.DefaultSizes(), 5
	ss, scaleRuns := bench.DefaultScaleSizes(), 3
	if quick {
		s, runs = bench.QuickSizes(), 1
		ss, scaleRuns = bench.QuickScaleSizes(), 1
	}
	flag.Bool("quick", false, "tiny sizes and 1 run, so that every workload and system runs in seconds (other flags still apply)")
	flag.IntVar(&runs, "runs", runs, "runs of every case; figures are medians")
	flag.IntVar(&s.N, "n", s.N, "messages per case of workloads 1-3 and of Ferry's SyncNever/SyncEvery")
	flag.IntVar(&s.SlowN, "slow-n", s.SlowN, "message cap for slow peers (Watermill, JetStream), 0 = no cap")
	flag.IntVar(&s.BodyBytes, "size", s.BodyBytes, "body bytes")
	flag.IntVar(&s.Batch, "batch", s.Batch, "batch size of workload 2")
	flag.IntVar(&s.Producers, "producers", s.Producers, "producers of workload 3")
	flag.IntVar(&s.Queues, "queues", s.Queues, "queues of workload 3")
	flag.IntVar(&s.Consumers, "consumers", s.Consumers, "consumers of workload 3")
	flag.IntVar(&s.Rate, "rate", s.Rate, "offered rate of workload 4, msgs/s")
	flag.IntVar(&s.LatencyN, "latency-n", s.LatencyN, "messages of workload 4")
	flag.IntVar(&s.SyncN, "sync-n", s.SyncN, "messages of the single-producer SyncAlways cases of workload 5")
	flag.IntVar(&s.SyncProducers, "sync-producers", s.SyncProducers, "producers of the concurrent SyncAlways case")
	flag.IntVar(&s.SyncProducerN, "sync-producer-n", s.SyncProducerN, "messages per producer of the concurrent SyncAlways case")
	flag.DurationVar(&s.SyncEvery, "sync-every", s.SyncEvery, "interval of Ferry's SyncEvery case")
	flag.StringVar(&s.Dir, "dir", s.Dir, "directory for the durable cases' files (use a real disk, not tmpfs)")
	flag.DurationVar(&s.Timeout, "timeout", s.Timeout, "bound on one case of one run")
	flag.IntVar(&scaleRuns, "scale-runs", scaleRuns, "runs of every scale point (workloads 6-9)")
	topics := flag.String("topics", joinInts(ss.Topics), "topic counts of workload 6")
	flag.IntVar(&ss.TopicMsgs, "topic-n", ss.TopicMsgs, "messages spread over the topics in workload 6")
	flag.DurationVar(&ss.Idle, "idle", ss.Idle, "quiet time over which workload 6 measures idle CPU")
	flag.IntVar(&ss.PacedRate, "paced-rate", ss.PacedRate, "rate of workload 7, msgs/s")
	flag.IntVar(&ss.PacedN, "paced-n", ss.PacedN, "messages of workload 7")
	flag.IntVar(&ss.BacklogN, "backlog-n", ss.BacklogN, "messages of workload 8's backlog")
	flag.IntVar(&ss.Joins, "joins", ss.Joins, "joins timed in workload 9")
	point := flag.String("point", "", "measure one scale point in this process, as 6/ferry/10000 or 7/chan, and print its sample as JSON (for profiling; the command runs every point this way in a child)")
	sizesJSON := flag.String("scale-sizes", "", "the scale sizes as JSON (used by the parent to pass them to a -point child)")
	memprofile := flag.String("memprofile", "", "with -point: write a heap profile to this file once the point is set up")
	workloads := flag.String("workloads", "", "comma-separated workloads 1-9 (default all; 6-9 are the scale workloads)")
	systems := flag.String("systems", "", "comma-separated systems: ferry, chan, watermill, nats, jetstream, diskqueue (default all; Ferry's reference cases always run)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	liveHeap := flag.Int("live-heap", 0, "MB of pointer-free memory kept live through workloads 1-5, as a service's own heap would be: the GC paces its cycles on the live heap, which is almost nothing in this program (the targets are judged without it)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}

	var err error
	if ss.Topics, err = parseInts(*topics); err != nil {
		return fmt.Errorf("-topics: %w", err)
	}
	if *sizesJSON != "" {
		if err := json.Unmarshal([]byte(*sizesJSON), &ss); err != nil {
			return fmt.Errorf("-scale-sizes: %w", err)
		}
	}
	opts := bench.Options{Runs: runs}
	ws, err := parseInts(*workloads)
	if err != nil {
		return fmt.Errorf("-workloads: %w", err)
	}
	var scaleWs []int
	for _, w := range ws {
		if bench.IsScaleWorkload(w) {
			scaleWs = append(scaleWs, w)
		} else {
			opts.Workloads = append(opts.Workloads, w)
		}
	}
	opts.Systems = splitList(*systems)
	runBase := len(ws) == 0 || len(opts.Workloads) > 0
	runScale := len(ws) == 0 || len(scaleWs) > 0
	if *memprofile != "" && *point == "" {
		return errors.New("-memprofile needs -point")
	}
	if *liveHeap < 0 {
		return errors.New("-live-heap must not be negative")
	}

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *point != "" {
		return runPoint(ctx, ss, *point, *memprofile)
	}
	var progress io.Writer = os.Stderr
	if *quiet {
		progress = nil
	}
	var failed []string
	if runBase {
		heap := make([]byte, *liveHeap<<20) // never touched: no RSS, but the GC counts it
		rep, err := bench.Run(ctx, s, opts, progress)
		runtime.KeepAlive(heap)
		if err != nil {
			return err
		}
		if *liveHeap > 0 {
			fmt.Printf("With %d MB of live heap besides the workloads' (-live-heap).\n\n", *liveHeap)
		}
		if err := rep.WriteTable(os.Stdout); err != nil {
			return err
		}
		for _, res := range rep.Results {
			if slices.ContainsFunc(res.Errs, func(err error) bool { return err != nil }) {
				failed = append(failed, fmt.Sprintf("w%d %s", res.Workload, res.Name))
			}
		}
	}
	if runScale {
		if err := ss.Validate(); err != nil {
			return err
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		sizes, err := json.Marshal(ss)
		if err != nil {
			return err
		}
		sopts := bench.ScaleOptions{
			Runs:   scaleRuns,
			Points: bench.ScalePoints(ss, scaleWs, opts.Systems),
			Measure: func(ctx context.Context, p bench.ScalePoint) (bench.ScaleSample, error) {
				return measureChild(ctx, exe, string(sizes), p, ss.Timeout)
			},
		}
		rep, err := bench.RunScale(ctx, ss, sopts, progress)
		if err != nil {
			return err
		}
		if runBase {
			fmt.Println()
		}
		if err := rep.WriteTable(os.Stdout); err != nil {
			return err
		}
		for _, res := range rep.Results {
			if slices.ContainsFunc(res.Errs, func(err error) bool { return err != nil }) {
				failed = append(failed, res.ScalePoint.String())
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// runPoint measures one scale point in this process and prints its sample
// as JSON on stdout.
func runPoint(ctx context.Context, ss bench.ScaleSizes, spec, memprofile string) error {
	p, err := bench.ParseScalePoint(spec)
	if err != nil {
		return err
	}
	var profErr error
	if memprofile != "" {
		ss.OnSetup = func() {
			f, err := os.Create(memprofile)
			if err != nil {
				profErr = err
				return
			}
			runtime.GC()
			profErr = errors.Join(pprof.Lookup("heap").WriteTo(f, 0), f.Close())
		}
	}
	smp, err := bench.MeasureScale(ctx, ss, p)
	if err != nil {
		return fmt.Errorf("%v: %w", p, err)
	}
	if profErr != nil {
		return fmt.Errorf("-memprofile: %w", profErr)
	}
	return json.NewEncoder(os.Stdout).Encode(smp)
}

// measureChild measures point p in a child process running this binary
// with -point, so that the memory it reports is the point's alone.
func measureChild(ctx context.Context, exe, sizes string, p bench.ScalePoint, timeout time.Duration) (bench.ScaleSample, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, exe, "-point", p.String(), "-scale-sizes", sizes)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return bench.ScaleSample{}, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var smp bench.ScaleSample
	if err := json.Unmarshal(stdout.Bytes(), &smp); err != nil {
		return bench.ScaleSample{}, fmt.Errorf("reading the child's sample: %w", err)
	}
	return smp, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
