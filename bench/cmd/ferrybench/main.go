// Command ferrybench measures Ferry and the systems users would pick
// instead (a Go channel, Watermill's GoChannel, NATS core and JetStream
// embedded, go-diskqueue) on the same workloads in one run, and prints a
// table of throughput, ns/msg, allocations/msg, latency percentiles and
// each peer's ratio to Ferry, then the project's targets.
//
// Usage:
//
//	go run ./cmd/ferrybench                  # full run: 1M messages, 5 runs
//	go run ./cmd/ferrybench -quick           # tiny sizes, 1 run, seconds
//	go run ./cmd/ferrybench -workloads 1,4 -systems ferry,chan -runs 7
//
// Every figure is a median over -runs; every ratio is taken within a run,
// then the median. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"

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
	if quick {
		s, runs = bench.QuickSizes(), 1
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
	workloads := flag.String("workloads", "", "comma-separated workloads 1-5 (default all)")
	systems := flag.String("systems", "", "comma-separated systems: ferry, chan, watermill, nats, jetstream, diskqueue (default all; Ferry's reference cases always run)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}

	opts := bench.Options{Runs: runs}
	for _, w := range splitList(*workloads) {
		n, err := strconv.Atoi(w)
		if err != nil {
			return fmt.Errorf("-workloads: %q is not a number", w)
		}
		opts.Workloads = append(opts.Workloads, n)
	}
	opts.Systems = splitList(*systems)

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
	var progress io.Writer = os.Stderr
	if *quiet {
		progress = nil
	}
	rep, err := bench.Run(ctx, s, opts, progress)
	if err != nil {
		return err
	}
	return rep.WriteTable(os.Stdout)
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
