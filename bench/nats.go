package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsCases: nats-server v2.15 embedded in the process (no listener;
// clients connect through nats.InProcessServer), nats.go v1.55. NATS core
// is fire and forget; a subscriber with unlimited pending limits handles
// each message. JetStream uses one stream over the bench.> subjects and one
// durable pull consumer with explicit acks, consumed with Consume and
// acked per message; publishing waits for each PubAck (Publish) or, in the
// batch and latency workloads, uses PublishAsync. In workload 3 the
// consumers form a queue group (core) or share the durable consumer
// (JetStream), and producers publish round robin over Queues subjects.
func natsCases() []Case {
	mem, file := jetstream.MemoryStorage, jetstream.FileStorage
	return []Case{
		{Workload: 1, System: "nats", Name: "nats core", messages: allN, setup: natsCore(false)},
		{Workload: 1, System: "jetstream", Name: "jetstream memory", messages: slowN, setup: jsCase(mem, false, false)},
		{Workload: 1, System: "jetstream", Name: "jetstream file", messages: slowN, setup: jsCase(file, false, false)},
		{Workload: 2, System: "nats", Name: "nats core (no batch API)", messages: allN, setup: natsCore(false)},
		{Workload: 2, System: "jetstream", Name: "jetstream memory PublishAsync", messages: slowN, setup: jsCase(mem, true, false)},
		{Workload: 2, System: "jetstream", Name: "jetstream file PublishAsync", messages: slowN, setup: jsCase(file, true, false)},
		{Workload: 3, System: "nats", Name: "nats core queue group", messages: allN, setup: natsCore(true)},
		{Workload: 3, System: "jetstream", Name: "jetstream memory", messages: slowN, setup: jsCase(mem, false, true)},
		{Workload: 3, System: "jetstream", Name: "jetstream file", messages: slowN, setup: jsCase(file, false, true)},
		{Workload: 4, System: "nats", Name: "nats core", messages: latencyN, setup: natsCore(false)},
		{Workload: 4, System: "jetstream", Name: "jetstream memory PublishAsync", messages: latencyN, setup: jsCase(mem, true, false)},
	}
}

// natsServer is an embedded server, its clients and its store directory.
type natsServer struct {
	ns    *server.Server
	dir   string
	mu    sync.Mutex // guards conns and asyncErr
	conns []*nats.Conn
	err   error // first asynchronous client error (a slow consumer drops messages)
}

func startNATS(e *env, js bool) (*natsServer, error) {
	s := &natsServer{}
	opts := &server.Options{
		DontListen: true, NoLog: true, NoSigs: true,
		MaxPending: 1 << 30, // never cut a subscriber off as slow: that would lose messages
		JetStream:  js,
	}
	if js {
		dir, err := os.MkdirTemp(e.Dir, "ferrybench-nats-*")
		if err != nil {
			return nil, err
		}
		s.dir, opts.StoreDir = dir, dir
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, errors.Join(err, s.removeDir())
	}
	s.ns = ns
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return nil, errors.Join(errors.New("nats server not ready"), s.close())
	}
	return s, nil
}

func (s *natsServer) connect() (*nats.Conn, error) {
	nc, err := nats.Connect("", nats.InProcessServer(s.ns), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		s.mu.Lock()
		s.err = cmpOr(s.err, err)
		s.mu.Unlock()
	}))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conns = append(s.conns, nc)
	s.mu.Unlock()
	return nc, nil
}

// asyncErr returns the first asynchronous client error.
func (s *natsServer) asyncErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return fmt.Errorf("nats client: %w", s.err)
	}
	return nil
}

func (s *natsServer) close() error {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for _, nc := range conns {
		nc.Close()
	}
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	}
	return s.removeDir()
}

func (s *natsServer) removeDir() error {
	if s.dir == "" {
		return nil
	}
	return os.RemoveAll(s.dir)
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// subjects returns the subjects of k queues.
func subjects(k int) []string {
	out := make([]string, k)
	for i := range out {
		out[i] = "bench." + strconv.Itoa(i)
	}
	return out
}

// natsCore: group=false is one subscriber on one subject (paced in the
// latency workload); group=true is Consumers members of a queue group on
// bench.* and Producers publishers over Queues subjects.
func natsCore(group bool) func(ctx context.Context, e *env) (*trial, error) {
	return func(ctx context.Context, e *env) (_ *trial, err error) {
		srv, err := startNATS(e, false)
		if err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, srv.close())
			}
		}()
		handler := func(m *nats.Msg) { e.sink.handle(m.Data) }
		consumers, subject := 1, "bench.0"
		if group {
			consumers, subject = e.Consumers, "bench.*"
		}
		for range consumers {
			nc, err := srv.connect()
			if err != nil {
				return nil, err
			}
			var sub *nats.Subscription
			if group {
				sub, err = nc.QueueSubscribe(subject, "g", handler)
			} else {
				sub, err = nc.Subscribe(subject, handler)
			}
			if err != nil {
				return nil, err
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil {
				return nil, err
			}
			if err := nc.Flush(); err != nil {
				return nil, err
			}
		}
		pub, err := srv.connect()
		if err != nil {
			return nil, err
		}
		run := func(ctx context.Context) error {
			var err error
			switch {
			case e.bodies != nil:
				err = e.sink.pace(ctx, e.n, func(i int) error { return pub.Publish("bench.0", e.bodies[i]) })
			case group:
				err = publishGroup(e, func(subject string, body []byte) error { return pub.Publish(subject, body) })
			default:
				for range e.n {
					if err = pub.Publish("bench.0", e.body); err != nil {
						break
					}
				}
			}
			if err == nil {
				err = pub.Flush()
			}
			if err == nil {
				err = e.sink.wait(ctx)
			}
			return cmpOr(err, srv.asyncErr())
		}
		return &trial{run: run, close: srv.close}, nil
	}
}

// publishGroup runs Producers goroutines publishing their share of n
// round robin over Queues subjects, and returns the first error.
func publishGroup(e *env, publish func(subject string, body []byte) error) error {
	subs := subjects(e.Queues)
	errs := make([]error, e.Producers)
	var wg sync.WaitGroup
	for p := range e.Producers {
		wg.Go(func() {
			q := p
			for range split(e.n, e.Producers, p) {
				if err := publish(subs[q%len(subs)], e.body); err != nil {
					errs[p] = err
					return
				}
				q++
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// jsCase: storage is the stream's; async publishes with PublishAsync;
// group runs Consumers consumers on the shared durable and Producers
// publishers.
func jsCase(storage jetstream.StorageType, async, group bool) func(ctx context.Context, e *env) (*trial, error) {
	return func(ctx context.Context, e *env) (_ *trial, err error) {
		srv, err := startNATS(e, true)
		if err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, srv.close())
			}
		}()
		admin, err := srv.connect()
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(admin)
		if err != nil {
			return nil, err
		}
		stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: storage})
		if err != nil {
			return nil, err
		}
		_, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "g", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			return nil, err
		}
		consumers := 1
		if group {
			consumers = e.Consumers
		}
		var (
			ackMu  sync.Mutex
			ackErr error
			ccs    []jetstream.ConsumeContext
		)
		stop := func() {
			for _, cc := range ccs {
				cc.Stop()
				<-cc.Closed()
			}
			ccs = nil
		}
		defer func() {
			if err != nil {
				stop()
			}
		}()
		for range consumers {
			nc, err := srv.connect()
			if err != nil {
				return nil, err
			}
			js, err := jetstream.New(nc)
			if err != nil {
				return nil, err
			}
			c, err := js.Consumer(ctx, "BENCH", "g")
			if err != nil {
				return nil, err
			}
			cc, err := c.Consume(func(m jetstream.Msg) {
				e.sink.handle(m.Data())
				if err := m.Ack(); err != nil {
					ackMu.Lock()
					ackErr = cmpOr(ackErr, err)
					ackMu.Unlock()
				}
			})
			if err != nil {
				return nil, err
			}
			ccs = append(ccs, cc)
		}
		pub, err := srv.connect()
		if err != nil {
			return nil, err
		}
		pjs, err := jetstream.New(pub)
		if err != nil {
			return nil, err
		}
		publish := func(subject string, body []byte) error {
			if async {
				// A full window of unacknowledged publishes waits for room
				// (200 ms by default, then ErrTooManyStalledMsgs): on a
				// loaded machine that fails runs, so wait as long as a case may.
				_, err := pjs.PublishAsync(subject, body, jetstream.WithStallWait(e.Timeout))
				return err
			}
			_, err := pjs.Publish(context.Background(), subject, body)
			return err
		}
		run := func(ctx context.Context) error {
			var err error
			switch {
			case e.bodies != nil:
				err = e.sink.pace(ctx, e.n, func(i int) error { return publish("bench.0", e.bodies[i]) })
			case group:
				err = publishGroup(e, publish)
			default:
				for range e.n {
					if err = publish("bench.0", e.body); err != nil {
						break
					}
				}
			}
			if err == nil && async {
				select {
				case <-pjs.PublishAsyncComplete():
				case <-ctx.Done():
					err = fmt.Errorf("waiting for async publish acks: %w", ctx.Err())
				}
			}
			if err == nil {
				err = e.sink.wait(ctx)
			}
			ackMu.Lock()
			err = cmpOr(err, ackErr)
			ackMu.Unlock()
			return cmpOr(err, srv.asyncErr())
		}
		return &trial{run: run, close: func() error { stop(); return srv.close() }}, nil
	}
}
