package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
)

// Sizes are the sizes of a benchmark run. Zero values are not filled in:
// start from [DefaultSizes] or [QuickSizes].
type Sizes struct {
	// N is the number of messages of each case of workloads 1–3 and of
	// Ferry's SyncNever and SyncEvery cases of workload 5.
	N int
	// SlowN caps the messages of the cases marked slow (peers that move
	// well under a million messages a second, so that a run stays in
	// minutes); 0 means no cap. Rates do not depend on it much.
	SlowN int
	// BodyBytes is the size of every message body.
	BodyBytes int
	// Batch is the batch size of workload 2.
	Batch int
	// Producers, Queues and Consumers shape workload 3.
	Producers, Queues, Consumers int
	// Rate is the offered rate of workload 4, in messages a second, and
	// LatencyN its number of messages.
	Rate, LatencyN int
	// SyncN is the number of messages of the single-producer SyncAlways
	// cases of workload 5; SyncProducers producers send SyncProducerN
	// messages each in the concurrent one.
	SyncN, SyncProducers, SyncProducerN int
	// SyncEvery is the interval of Ferry's SyncEvery case.
	SyncEvery time.Duration
	// Dir is where durable cases make their temporary directories.
	Dir string
	// Timeout bounds one case of one run.
	Timeout time.Duration
}

// DefaultSizes returns the sizes of a full run.
func DefaultSizes() Sizes {
	return Sizes{
		N: 1_000_000, SlowN: 100_000, BodyBytes: 100, Batch: 100,
		Producers: 4, Queues: 8, Consumers: 4,
		Rate: 50_000, LatencyN: 100_000,
		SyncN: 2_000, SyncProducers: 64, SyncProducerN: 1_000,
		SyncEvery: 100 * time.Millisecond,
		Dir:       os.TempDir(), Timeout: 3 * time.Minute,
	}
}

// QuickSizes returns tiny sizes that exercise every case in seconds.
func QuickSizes() Sizes {
	s := DefaultSizes()
	s.N, s.SlowN, s.LatencyN = 5_000, 2_000, 2_000
	s.Rate = 20_000
	s.SyncN, s.SyncProducerN = 50, 10
	s.SyncEvery = 10 * time.Millisecond
	s.Timeout = time.Minute
	return s
}

// Validate reports a size out of range.
func (s Sizes) Validate() error {
	switch {
	case s.N < 1, s.SlowN < 0, s.LatencyN < 1, s.SyncN < 1, s.SyncProducerN < 1:
		return errors.New("bench: message counts must be positive")
	case s.BodyBytes < 8:
		return fmt.Errorf("bench: body of %d bytes: at least 8 (workload 4 stamps a sequence number)", s.BodyBytes)
	case s.Batch < 1, s.Producers < 1, s.Queues < 1, s.Consumers < 1, s.SyncProducers < 1:
		return errors.New("bench: batch, producer, queue and consumer counts must be positive")
	case s.Rate < 1 || s.Rate > 1_000_000_000:
		return fmt.Errorf("bench: rate %d not in [1, 1e9]", s.Rate)
	case s.SyncEvery <= 0, s.Timeout <= 0:
		return errors.New("bench: durations must be positive")
	}
	return nil
}

// Case is one system doing one workload.
type Case struct {
	// Workload is 1 to 5.
	Workload int
	// System is the family the case belongs to (ferry, chan, watermill,
	// nats, jetstream, diskqueue), for selecting cases.
	System string
	// Name labels the case's row.
	Name string
	// Ref marks the Ferry case the workload's peers are compared with.
	Ref bool
	// messages returns how many messages the case moves.
	messages func(s Sizes) int
	// setup prepares the system; the harness times the trial's run.
	setup func(ctx context.Context, e *env) (*trial, error)
}

// trial is a prepared case: run is timed, close tears everything down and
// waits for every goroutine the case started.
type trial struct {
	run   func(ctx context.Context) error
	close func() error
}

// env is what a case's setup gets.
type env struct {
	Sizes
	n      int
	body   []byte   // shared read-only body
	bodies [][]byte // latency workload: one body per message, stamped with its index
	sink   *sink
}

// bodyOf returns the body of message i.
func (e *env) bodyOf(i int) []byte {
	if e.bodies != nil {
		return e.bodies[i]
	}
	return e.body
}

// sink is the handler every system calls per message: it counts, records
// latency in the latency workload and signals when all n have arrived.
type sink struct {
	n     int64
	seen  atomic.Int64
	done  chan struct{}
	lat   []time.Duration // per message index; nil outside workloads 4 and 7
	start time.Time       // when message 0 was due
	every time.Duration   // interval between due times
	// sentAt, when set (workload 7), is when each message was sent, as an
	// offset from start: latency is then measured from the send, and
	// pace sleeps between bursts instead of spinning.
	sentAt []time.Duration
}

func newSink(n int) *sink { return &sink{n: int64(n), done: make(chan struct{})} }

// handle is the handler body: count, and in the latency workload record
// how long after it was due the message arrived.
func (s *sink) handle(body []byte) {
	if s.lat != nil {
		i := binary.LittleEndian.Uint64(body)
		if s.sentAt != nil {
			s.lat[i] = time.Since(s.start) - s.sentAt[i]
		} else {
			s.lat[i] = time.Since(s.start) - time.Duration(i)*s.every
		}
	}
	if s.seen.Add(1) == s.n {
		close(s.done)
	}
}

// wait waits until every message has been handled.
func (s *sink) wait(ctx context.Context) error {
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("handled %d of %d messages: %w", s.seen.Load(), s.n, ctx.Err())
	}
}

// pace calls send(i) for i in [0, n) at the sink's offered rate, i falling
// due at start + i*every; a late send goes at once (the delay counts in
// the latency, which is measured from the due time). With sentAt set it
// paces by sleeping instead (see paceSleep).
func (s *sink) pace(ctx context.Context, n int, send func(i int) error) error {
	if s.sentAt != nil {
		return s.paceSleep(ctx, n, send)
	}
	s.start = time.Now()
	for i := range n {
		due := time.Duration(i) * s.every
		for time.Since(s.start) < due {
			runtime.Gosched()
		}
		if err := send(i); err != nil {
			return err
		}
		if i&1023 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// paceSleep is pace for workload 7, where CPU is measured: the producer
// sleeps until the next message is due, then sends every message due by
// then in a burst (a sleep lasts tens of µs to a millisecond, so a burst
// at 100,000 msgs/s is a few to 100 messages), stamping each one's send
// time in sentAt just before its send.
func (s *sink) paceSleep(ctx context.Context, n int, send func(i int) error) error {
	s.start = time.Now()
	for i := 0; i < n; {
		now := time.Since(s.start)
		if due := time.Duration(i) * s.every; now < due {
			time.Sleep(due - now)
			continue
		}
		for ; i < n && time.Duration(i)*s.every <= now; i++ {
			s.sentAt[i] = time.Since(s.start)
			if err := send(i); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// Sample is one measurement of one case.
type Sample struct {
	Msgs    int
	Elapsed time.Duration
	// CPU is the CPU time the whole process used meanwhile (every
	// goroutine, the GC, embedded servers): unlike Elapsed it hardly
	// depends on other load on the machine. Zero where unknown.
	CPU     time.Duration
	Mallocs uint64
	// P50, P99 and P999 are set in the latency workload only.
	P50, P99, P999 time.Duration
}

// Rate returns messages a second.
func (s Sample) Rate() float64 { return float64(s.Msgs) / s.Elapsed.Seconds() }

// NsPerMsg returns nanoseconds of wall time per message.
func (s Sample) NsPerMsg() float64 { return float64(s.Elapsed.Nanoseconds()) / float64(s.Msgs) }

// CPUPerMsg returns nanoseconds of process CPU time per message.
func (s Sample) CPUPerMsg() float64 { return float64(s.CPU.Nanoseconds()) / float64(s.Msgs) }

// AllocsPerMsg returns heap allocations per message, counted over the
// whole process while the case ran.
func (s Sample) AllocsPerMsg() float64 { return float64(s.Mallocs) / float64(s.Msgs) }

// latencyWarmup is how many of the first messages of the latency workload
// are left out of its percentiles.
func latencyWarmup(n int) int { return min(1000, n/10) }

// newEnv prepares what case c gets at sizes s.
func newEnv(c Case, s Sizes) *env {
	n := c.messages(s)
	e := &env{Sizes: s, n: n, body: make([]byte, s.BodyBytes), sink: newSink(n)}
	for i := range e.body {
		e.body[i] = byte('a' + i%26)
	}
	if c.Workload == 4 {
		e.bodies = make([][]byte, n)
		for i := range e.bodies {
			b := slices.Clone(e.body)
			binary.LittleEndian.PutUint64(b, uint64(i))
			e.bodies[i] = b
		}
		e.sink.lat = make([]time.Duration, n)
		e.sink.every = time.Second / time.Duration(s.Rate)
	}
	return e
}

// finish closes t and checks that every message was handled exactly once
// (workloads 1–4; workload 5 has no consumer).
func finish(c Case, e *env, t *trial, runErr error) error {
	if err := t.close(); runErr == nil && err != nil {
		runErr = fmt.Errorf("close: %w", err)
	}
	if runErr != nil {
		return runErr
	}
	if seen := e.sink.seen.Load(); c.Workload != 5 && seen != e.sink.n {
		return fmt.Errorf("handled %d messages, sent %d", seen, e.sink.n)
	}
	return nil
}

// measure runs one case once.
func measure(ctx context.Context, c Case, s Sizes) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	e := newEnv(c, s)
	t, err := c.setup(ctx, e)
	if err != nil {
		return Sample{}, fmt.Errorf("setup: %w", err)
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0, start := cpuTime(), time.Now()
	err = t.run(ctx)
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	runtime.ReadMemStats(&m1)
	if err := finish(c, e, t, err); err != nil {
		return Sample{}, err
	}
	smp := Sample{Msgs: e.n, Elapsed: elapsed, CPU: cpu, Mallocs: m1.Mallocs - m0.Mallocs}
	if lat := e.sink.lat; lat != nil {
		lat = lat[latencyWarmup(e.n):]
		slices.Sort(lat)
		smp.P50, smp.P99, smp.P999 = percentile(lat, 0.50), percentile(lat, 0.99), percentile(lat, 0.999)
	}
	return smp, nil
}

// percentile returns the q-quantile of sorted (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Options choose what a run measures.
type Options struct {
	// Runs is how many times every case runs (the figures are medians).
	Runs int
	// Workloads selects workloads by number; empty means all.
	Workloads []int
	// Systems selects cases by family (see [Case.System]); empty means
	// all. Ferry's reference cases always run, since ratios need them.
	Systems []string
}

// Result is every run of one case.
type Result struct {
	Case
	// Samples has one entry per run; Errs[i] is set where run i failed.
	Samples []Sample
	Errs    []error
}

// Report is the outcome of [Run].
type Report struct {
	Sizes   Sizes
	Runs    int
	Started time.Time
	Took    time.Duration
	Results []*Result
}

// Run measures the selected cases opts.Runs times, interleaving the cases
// within each run so that drift on a shared machine spreads over all of
// them. It writes a line per measurement to progress (if not nil). A case
// that fails is recorded in its Result and the run goes on.
func Run(ctx context.Context, s Sizes, opts Options, progress io.Writer) (*Report, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if opts.Runs < 1 {
		return nil, fmt.Errorf("bench: %d runs: at least 1", opts.Runs)
	}
	if progress == nil {
		progress = io.Discard
	}
	cases, err := Select(opts.Workloads, opts.Systems)
	if err != nil {
		return nil, err
	}
	rep := &Report{Sizes: s, Runs: opts.Runs, Started: time.Now()}
	for _, c := range cases {
		rep.Results = append(rep.Results, &Result{Case: c, Samples: make([]Sample, opts.Runs), Errs: make([]error, opts.Runs)})
	}
	for r := range opts.Runs {
		for _, res := range rep.Results {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			smp, err := measure(ctx, res.Case, s)
			res.Samples[r], res.Errs[r] = smp, err
			if err != nil {
				fmt.Fprintf(progress, "run %d/%d  w%d %-28s FAILED: %v\n", r+1, opts.Runs, res.Workload, res.Name, err)
				continue
			}
			fmt.Fprintf(progress, "run %d/%d  w%d %-32s %11.0f msgs/s %9.1f ns/msg %9.1f cpu ns/msg %6.2f allocs/msg\n",
				r+1, opts.Runs, res.Workload, res.Name, smp.Rate(), smp.NsPerMsg(), smp.CPUPerMsg(), smp.AllocsPerMsg())
		}
	}
	rep.Took = time.Since(rep.Started)
	return rep, nil
}

// Select returns the cases of the given workloads and system families
// (empty: all), Ferry's reference cases always included.
func Select(workloads []int, systems []string) ([]Case, error) {
	for _, w := range workloads {
		if w < 1 || w > 5 {
			return nil, fmt.Errorf("bench: no workload %d (1 to 5)", w)
		}
	}
	all := Cases()
	for _, sys := range systems {
		if !slices.ContainsFunc(all, func(c Case) bool { return c.System == sys }) {
			return nil, fmt.Errorf("bench: no system %q", sys)
		}
	}
	var out []Case
	for _, c := range all {
		if len(workloads) > 0 && !slices.Contains(workloads, c.Workload) {
			continue
		}
		if len(systems) > 0 && !c.Ref && !slices.Contains(systems, c.System) {
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// Cases returns every case, workload by workload, Ferry's first.
func Cases() []Case {
	var all []Case
	for _, group := range [][]Case{ferryCases(), chanCases(), watermillCases(), natsCases(), durableCases(), diskqueueCases()} {
		all = append(all, group...)
	}
	slices.SortStableFunc(all, func(a, b Case) int { return a.Workload - b.Workload })
	return all
}

// allN and slowN are the message counts of ordinary and slow cases.
func allN(s Sizes) int { return s.N }

func slowN(s Sizes) int {
	if s.SlowN > 0 {
		return min(s.N, s.SlowN)
	}
	return s.N
}

func latencyN(s Sizes) int { return s.LatencyN }

// split returns the share of n of worker i of k (the first n%k get one
// more).
func split(n, k, i int) int {
	q := n / k
	if i < n%k {
		q++
	}
	return q
}
