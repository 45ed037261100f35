package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// This file is natsbench: Ferry over natsstore beside raw nats.go doing
// the same work on the same embedded servers (file storage, clients over
// loopback TCP), on one server (R1) and on a 3-node cluster in the
// process (R3):
//
//   - sync: one message at a time, each acknowledged: Producer.Send vs
//     jetstream.Publish.
//   - batch: batches of NATSSizes.Batch: Producer.SendBatch (one atomic
//     batch publish per call, one call at a time) vs PublishAsync with its
//     default window of 4,000 unacknowledged messages, and vs
//     jetstreamext.PublishMsgBatch (the atomic batch natsstore uses), one
//     batch at a time. Like with like, as many messages in flight: Ferry
//     with 4,000 ÷ Batch goroutines calling SendBatch at once ("ferry N
//     senders") beside PublishAsync's 4,000, and one SendBatch at a time
//     beside PublishAsync with a window of Batch ("nats window=Batch").
//     And one goroutine calling Producer.SendAsync with 4,000 in flight
//     (WithMaxInFlight) beside PublishAsync's 4,000 ("ferry async").
//   - latency: publish → handler, one message in flight (the next sent
//     once the previous was handled): Send to a consumer group member on
//     natsstore's coordinator and cursor store vs jetstream.Publish to a
//     durable pull consumer (Consume, an explicit ack per message).
//
// Every case uses a stream of its own, deleted afterwards; Ferry's topic
// has one queue (one stream).

// NATSSizes are the sizes of a natsbench run.
type NATSSizes struct {
	SyncN, BatchN, Batch, LatencyN, BodyBytes int
	Runs                                      int
	Timeout                                   time.Duration
}

// DefaultNATSSizes returns the sizes of a full natsbench run.
func DefaultNATSSizes() NATSSizes {
	return NATSSizes{SyncN: 3_000, BatchN: 50_000, Batch: 100, LatencyN: 2_000, BodyBytes: 100, Runs: 3, Timeout: 2 * time.Minute}
}

// QuickNATSSizes returns tiny sizes that run every case in seconds.
func QuickNATSSizes() NATSSizes {
	return NATSSizes{SyncN: 200, BatchN: 2_000, Batch: 100, LatencyN: 200, BodyBytes: 100, Runs: 1, Timeout: time.Minute}
}

// NATSCase names one measurement: replicas, workload, system.
type NATSCase struct {
	Replicas int
	Workload string // "sync", "batch", "latency"
	System   string // "ferry", "nats", "nats atomic batch"
}

// NATSSample is one run of one case.
type NATSSample struct {
	Msgs     int
	Elapsed  time.Duration
	P50, P99 time.Duration // latency only
	Dups     int           // latency only: messages handled again
}

// NsPerMsg returns wall nanoseconds per message.
func (s NATSSample) NsPerMsg() float64 { return float64(s.Elapsed.Nanoseconds()) / float64(s.Msgs) }

// Rate returns messages a second.
func (s NATSSample) Rate() float64 { return float64(s.Msgs) / s.Elapsed.Seconds() }

// NATSReport is every run of every case.
type NATSReport struct {
	Sizes   NATSSizes
	Cases   []NATSCase
	Samples map[NATSCase][]NATSSample // one per run
	Took    time.Duration
}

// asyncWindow is PublishAsync's default window: the most unacknowledged
// messages it keeps in flight.
const asyncWindow = 4000

// Senders returns how many goroutines call SendBatch at once in the
// "ferry N senders" case: as many messages in flight as PublishAsync's
// default window.
func (s NATSSizes) Senders() int { return max(1, asyncWindow/s.Batch) }

// The systems of the batch cases that keep as many messages in flight as
// the other side.
func (s NATSSizes) ferrySenders() string { return fmt.Sprintf("ferry %d senders", s.Senders()) }
func (s NATSSizes) natsWindow() string   { return fmt.Sprintf("nats window=%d", s.Batch) }

// ferryAsync is the batch case of one goroutine calling SendAsync with
// asyncWindow sends in flight.
const ferryAsync = "ferry async"

func natsstoreCases(s NATSSizes) []NATSCase {
	var out []NATSCase
	for _, r := range []int{1, 3} {
		out = append(out,
			NATSCase{r, "sync", "ferry"}, NATSCase{r, "sync", "nats"},
			NATSCase{r, "batch", "ferry"}, NATSCase{r, "batch", "nats"}, NATSCase{r, "batch", "nats atomic batch"},
			NATSCase{r, "batch", s.ferrySenders()}, NATSCase{r, "batch", s.natsWindow()}, NATSCase{r, "batch", ferryAsync},
			NATSCase{r, "latency", "ferry"}, NATSCase{r, "latency", "nats"})
	}
	return out
}

// RunNATS measures every case s.Runs times: each run starts a server and
// a 3-node cluster and runs the cases one after the other, Ferry's and
// raw nats.go's interleaved. A failed case fails the run.
func RunNATS(ctx context.Context, s NATSSizes, progress io.Writer) (*NATSReport, error) {
	if s.SyncN < 1 || s.BatchN < 1 || s.Batch < 2 || s.Batch > natsstore.MaxBatch || s.LatencyN < 10 || s.BodyBytes < 8 || s.Runs < 1 || s.Timeout <= 0 {
		return nil, fmt.Errorf("bench: natsbench sizes out of range: %+v", s)
	}
	if progress == nil {
		progress = io.Discard
	}
	rep := &NATSReport{Sizes: s, Cases: natsstoreCases(s), Samples: map[NATSCase][]NATSSample{}}
	start := time.Now()
	seq := 0
	for run := range s.Runs {
		for _, replicas := range []int{1, 3} {
			rig, err := startRig(ctx, replicas)
			if err != nil {
				return nil, fmt.Errorf("servers with %d replicas: %w", replicas, err)
			}
			for _, c := range rep.Cases {
				if c.Replicas != replicas {
					continue
				}
				seq++
				cctx, cancel := context.WithTimeout(ctx, s.Timeout)
				smp, err := rig.measure(cctx, c, s, fmt.Sprintf("b%d", seq))
				cancel()
				if err != nil {
					return nil, errors.Join(fmt.Errorf("%s on %s with %d replicas: %w", c.Workload, c.System, c.Replicas, err), rig.close())
				}
				rep.Samples[c] = append(rep.Samples[c], smp)
				fmt.Fprintf(progress, "run %d/%d  R%d %-8s %-18s %9.0f msgs/s %9.1f µs/msg", run+1, s.Runs, c.Replicas, c.Workload, c.System, smp.Rate(), smp.NsPerMsg()/1e3)
				if c.Workload == "latency" {
					fmt.Fprintf(progress, "  p50 %s p99 %s µs, %d handled again", micros(smp.P50), micros(smp.P99), smp.Dups)
				}
				fmt.Fprintln(progress)
			}
			if err := rig.close(); err != nil {
				return nil, err
			}
		}
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// rig is one server or a 3-node cluster and a client connection.
type rig struct {
	servers  []*server.Server
	dirs     []string
	replicas int
	nc       *nats.Conn
	js       jetstream.JetStream
}

func startRig(ctx context.Context, replicas int) (_ *rig, err error) {
	r := &rig{replicas: replicas}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	var routes []string
	ports := make([]int, replicas)
	if replicas > 1 {
		for i := range ports {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			ports[i] = l.Addr().(*net.TCPAddr).Port
			_ = l.Close()
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i]))
		}
	}
	for i := range replicas {
		dir, err := os.MkdirTemp("", "natsbench-*")
		if err != nil {
			return nil, err
		}
		r.dirs = append(r.dirs, dir)
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, MaxPending: 1 << 30,
		}
		if replicas > 1 {
			opts.Cluster = server.ClusterOpts{Name: "natsbench", Host: "127.0.0.1", Port: ports[i]}
			opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		}
		s, err := server.NewServer(opts)
		if err != nil {
			return nil, err
		}
		s.Start()
		r.servers = append(r.servers, s)
	}
	urls := make([]string, len(r.servers))
	for i, s := range r.servers {
		if !s.ReadyForConnections(10 * time.Second) {
			return nil, errors.New("nats server not ready")
		}
		urls[i] = s.ClientURL()
	}
	if r.nc, err = nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1)); err != nil {
		return nil, err
	}
	if r.js, err = jetstream.New(r.nc); err != nil {
		return nil, err
	}
	// Requests before the meta leader is elected get no reply, and a
	// stream of R replicas is refused ("no suitable peers for placement,
	// peer offline", 10005) until every peer reported to it: the rig is
	// ready once a stream of its replicas is made. The stream stays, so
	// that the account's store directory never empties (a create racing
	// its removal fails, 10049).
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := r.js.CreateStream(actx, jetstream.StreamConfig{Name: "rigready", Replicas: replicas, Storage: jetstream.FileStorage})
		cancel()
		if err == nil {
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("JetStream not ready for streams of %d replicas: %w", replicas, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *rig) close() error {
	if r.nc != nil {
		r.nc.Close()
	}
	for _, s := range r.servers {
		s.Shutdown()
	}
	var errs []error
	for _, s := range r.servers {
		s.WaitForShutdown()
	}
	for _, d := range r.dirs {
		errs = append(errs, os.RemoveAll(d))
	}
	r.servers, r.dirs = nil, nil
	return errors.Join(errs...)
}

func (r *rig) measure(ctx context.Context, c NATSCase, s NATSSizes, name string) (NATSSample, error) {
	body := make([]byte, s.BodyBytes)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	switch c.System {
	case "ferry":
		return r.ferry(ctx, c.Workload, 1, s, name, body)
	case s.ferrySenders():
		return r.ferry(ctx, c.Workload, s.Senders(), s, name, body)
	case s.natsWindow():
		return r.raw(ctx, c.Workload, false, s.Batch, s, name, body)
	case ferryAsync:
		return r.ferry(ctx, "async", 1, s, name, body)
	}
	return r.raw(ctx, c.Workload, c.System == "nats atomic batch", asyncWindow, s, name, body)
}

// natsOpts are the options of the Stores and Coordinators of a case.
func (r *rig) natsOpts(prefix string) []natsstore.Option {
	// A new R3 stream waits for a Raft election: give it more than 2 s.
	return []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithReplicas(r.replicas), natsstore.WithOpTimeout(10 * time.Second)}
}

// ferry runs one Ferry case over natsstore, prefix name; senders
// goroutines call SendBatch at once in the batch case.
func (r *rig) ferry(ctx context.Context, workload string, senders int, s NATSSizes, name string, body []byte) (smp NATSSample, err error) {
	st, err := natsstore.Open(ctx, r.js, r.natsOpts(name)...)
	if err != nil {
		return smp, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	co, err := natsstore.NewCoordinator(ctx, r.js, r.natsOpts(name)...)
	if err != nil {
		return smp, err
	}
	defer func() { err = errors.Join(err, co.Close()) }()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	if err != nil {
		return smp, err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	// Deleting the streams and buckets is left to the rig's shutdown.
	n := map[string]int{"sync": s.SyncN, "batch": s.BatchN, "async": s.BatchN, "latency": s.LatencyN}[workload]
	ret := ferry.Retention{MaxMessages: int64(max(n, ferry.DefaultRetentionMessages)), MaxBytes: ferry.Unlimited}
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "bench", Queues: 1, Retention: ret}); err != nil {
		return smp, err
	}
	p, err := b.NewProducer(ferry.WithMaxInFlight(asyncWindow))
	if err != nil {
		return smp, err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	switch workload {
	case "async":
		var failed atomic.Int64
		done := func(_ ferry.SendResult, err error) {
			if err != nil {
				failed.Add(1)
			}
		}
		start := time.Now()
		for range n {
			if err := p.SendAsync(ctx, &ferry.Message{Topic: "bench", Body: body}, done); err != nil {
				return smp, err
			}
		}
		if err := p.Flush(ctx); err != nil {
			return smp, err
		}
		elapsed := time.Since(start)
		if k := failed.Load(); k > 0 {
			return smp, fmt.Errorf("%d async sends failed", k)
		}
		return NATSSample{Msgs: n, Elapsed: elapsed}, nil
	case "sync":
		start := time.Now()
		for range n {
			if _, err := p.Send(ctx, &ferry.Message{Topic: "bench", Body: body}); err != nil {
				return smp, err
			}
		}
		return NATSSample{Msgs: n, Elapsed: time.Since(start)}, nil
	case "batch":
		var next atomic.Int64 // messages taken by the senders
		errs := make([]error, senders)
		var wg sync.WaitGroup
		start := time.Now()
		for k := range senders {
			wg.Go(func() {
				batch := make([]*ferry.Message, s.Batch)
				for {
					sent := int(next.Add(int64(s.Batch))) - s.Batch
					if sent >= n {
						return
					}
					batch = batch[:min(s.Batch, n-sent)]
					for i := range batch {
						batch[i] = &ferry.Message{Topic: "bench", Body: body}
					}
					if _, err := p.SendBatch(ctx, batch); err != nil {
						errs[k] = err
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return smp, err
		}
		return NATSSample{Msgs: n, Elapsed: time.Since(start)}, nil
	}
	lt := newLatTracker(n)
	var resets atomic.Int64
	c, err := b.NewConsumer("g", "bench", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		lt.handled(m.Body)
		return nil
	}), ferry.WithOnReset(func(q ferry.QueueID, from, to int64) {
		if resets.Add(1) == 1 {
			fmt.Fprintf(os.Stderr, "natsbench: ferry consumer reset %v from %d to %d\n", q, from, to)
		}
	}))
	if err != nil {
		return smp, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	if err := c.Start(ctx); err != nil {
		return smp, err
	}
	return lt.run(ctx, body, func(b []byte) error {
		_, err := p.Send(ctx, &ferry.Message{Topic: "bench", Body: b})
		return err
	})
}

// raw runs one raw nats.go case on a stream of its own; PublishAsync
// keeps at most window messages unacknowledged.
func (r *rig) raw(ctx context.Context, workload string, atomicBatch bool, window int, s NATSSizes, name string, body []byte) (smp NATSSample, err error) {
	subject := name + ".raw"
	stream, err := r.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name + "_raw", Subjects: []string{subject}, Storage: jetstream.FileStorage, Replicas: r.replicas,
		AllowAtomicPublish: atomicBatch,
	})
	if err != nil {
		return smp, err
	}
	defer func() {
		err = errors.Join(err, r.js.DeleteStream(context.WithoutCancel(ctx), stream.CachedInfo().Config.Name))
	}()
	switch workload {
	case "sync":
		start := time.Now()
		for range s.SyncN {
			if _, err := r.js.Publish(ctx, subject, body); err != nil {
				return smp, err
			}
		}
		return NATSSample{Msgs: s.SyncN, Elapsed: time.Since(start)}, nil
	case "batch":
		n := s.BatchN
		start := time.Now()
		if atomicBatch {
			batch := make([]*nats.Msg, s.Batch)
			for sent := 0; sent < n; sent += len(batch) {
				batch = batch[:min(s.Batch, n-sent)]
				for i := range batch {
					batch[i] = &nats.Msg{Subject: subject, Header: nats.Header{}, Data: body}
				}
				if _, err := jetstreamext.PublishMsgBatch(ctx, r.js, batch); err != nil {
					return smp, err
				}
			}
			return NATSSample{Msgs: n, Elapsed: time.Since(start)}, nil
		}
		js := r.js
		if window != asyncWindow {
			if js, err = jetstream.New(r.nc, jetstream.WithPublishAsyncMaxPending(window)); err != nil {
				return smp, err
			}
		}
		var failed atomic.Int64
		futures := make([]jetstream.PubAckFuture, 0, n)
		for range n {
			f, err := js.PublishAsync(subject, body, jetstream.WithStallWait(s.Timeout))
			if err != nil {
				return smp, err
			}
			futures = append(futures, f)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return smp, fmt.Errorf("waiting for async publish acks: %w", ctx.Err())
		}
		elapsed := time.Since(start)
		for _, f := range futures {
			select {
			case <-f.Ok():
			case <-f.Err():
				failed.Add(1)
			}
		}
		if k := failed.Load(); k > 0 {
			return smp, fmt.Errorf("%d async publishes failed", k)
		}
		return NATSSample{Msgs: n, Elapsed: elapsed}, nil
	}
	n := s.LatencyN
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "g", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return smp, err
	}
	lt := newLatTracker(n)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		lt.handled(m.Data())
		_ = m.Ack()
	})
	if err != nil {
		return smp, err
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	return lt.run(ctx, body, func(b []byte) error {
		_, err := r.js.Publish(ctx, subject, b)
		return err
	})
}

// latTracker sends one message at a time, stamped with its index, and
// records how long after its send began each was handled.
type latTracker struct {
	sent []time.Time
	lat  []time.Duration
	seen []atomic.Bool
	dups atomic.Int64
	got  chan int
}

func newLatTracker(n int) *latTracker {
	return &latTracker{sent: make([]time.Time, n), lat: make([]time.Duration, n), seen: make([]atomic.Bool, n), got: make(chan int, n)}
}

func (l *latTracker) handled(body []byte) {
	i := int(binary.LittleEndian.Uint64(body))
	if i < 0 || i >= len(l.sent) {
		return
	}
	if !l.seen[i].CompareAndSwap(false, true) {
		l.dups.Add(1) // delivered again: at least once
		return
	}
	l.lat[i] = time.Since(l.sent[i])
	l.got <- i // never blocks: each index once, buffered for all
}

func (l *latTracker) run(ctx context.Context, body []byte, send func([]byte) error) (NATSSample, error) {
	n := len(l.sent)
	start := time.Now()
	for i := range n {
		b := slices.Clone(body)
		binary.LittleEndian.PutUint64(b, uint64(i))
		l.sent[i] = time.Now()
		if err := send(b); err != nil {
			return NATSSample{}, err
		}
		select {
		case j := <-l.got:
			if j != i {
				return NATSSample{}, fmt.Errorf("handled message %d, waiting for %d", j, i)
			}
		case <-ctx.Done():
			return NATSSample{}, fmt.Errorf("message %d of %d not handled: %w", i, n, ctx.Err())
		}
	}
	elapsed := time.Since(start)
	lat := slices.Clone(l.lat[min(100, n/10):]) // leave out the warm-up
	slices.Sort(lat)
	return NATSSample{Msgs: n, Elapsed: elapsed, P50: percentile(lat, 0.50), P99: percentile(lat, 0.99), Dups: int(l.dups.Load())}, nil
}
