// Command natsbench measures Ferry over natsstore beside raw nats.go doing
// the same work, on embedded NATS servers in the process: one server (R1)
// and a 3-node cluster (R3), file storage, clients over loopback TCP. It
// prints, per case, msgs/s, µs/msg and (latency) p50/p99, then Ferry's
// ratios to raw nats.go and the goals (reported, never asserted):
//
//   - sync (Send vs jetstream.Publish, one at a time): Ferry's time per
//     message ≤ 1.5× raw nats.go's;
//   - batch on R3 (SendBatch vs PublishAsync with its window): Ferry's
//     rate ≥ 0.8× raw's.
//
// Usage:
//
//	go run ./cmd/natsbench          # full run: 3 runs, about a minute on 2 cores
//	go run ./cmd/natsbench -quick   # tiny sizes, 1 run, seconds
//
// See README.md, "Ferry on NATS (natsbench)".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/ferrymq/ferry/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
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
	s := bench.DefaultNATSSizes()
	if quick {
		s = bench.QuickNATSSizes()
	}
	flag.Bool("quick", false, "tiny sizes and 1 run (other flags still apply)")
	flag.IntVar(&s.Runs, "runs", s.Runs, "runs of every case; figures are medians")
	flag.IntVar(&s.SyncN, "sync-n", s.SyncN, "messages of the sync cases")
	flag.IntVar(&s.BatchN, "batch-n", s.BatchN, "messages of the batch cases")
	flag.IntVar(&s.Batch, "batch", s.Batch, "batch size")
	flag.IntVar(&s.LatencyN, "latency-n", s.LatencyN, "messages of the latency cases")
	flag.IntVar(&s.BodyBytes, "size", s.BodyBytes, "body bytes")
	flag.DurationVar(&s.Timeout, "timeout", s.Timeout, "bound on one case of one run")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	progress := os.Stderr
	if *quiet {
		progress = nil
	}
	rep, err := bench.RunNATS(ctx, s, progress)
	if err != nil {
		return err
	}
	return rep.WriteTable(os.Stdout)
}
