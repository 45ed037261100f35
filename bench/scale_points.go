package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go"
)

// scaleEnv is the env of a scale point moving n messages.
func scaleEnv(s ScaleSizes, n int) *env {
	e := &env{Sizes: Sizes{BodyBytes: s.BodyBytes, Dir: os.TempDir(), Timeout: s.Timeout}, n: n, body: make([]byte, s.BodyBytes), sink: newSink(n)}
	for i := range e.body {
		e.body[i] = byte('a' + i%26)
	}
	return e
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeInto runs close and keeps its error in *err unless one is there.
func closeInto(err *error, close func() error) {
	if cerr := close(); *err == nil && cerr != nil {
		*err = fmt.Errorf("close: %w", cerr)
	}
}

// Workload 6: topics.

// topicRig is a system with T topics (subjects, channels), one consumer
// each, all handling into the env's sink.
type topicRig struct {
	// send sends message k to topic k % T.
	send func(ctx context.Context, k int) error
	// flush, if set, runs after the last send.
	flush func() error
	close func() error
	// createTopics is the part of the setup spent creating topics (zero
	// where topics are not created apart from their consumers).
	createTopics time.Duration
}

type topicSetup func(ctx context.Context, topics int, e *env) (*topicRig, error)

// topicsPoint: set up (timed), read memory, spread TopicMsgs messages
// round robin over the topics (CPU timed), let the process settle, then
// time the CPU of Idle of quiet.
func topicsPoint(setup topicSetup) scaleFunc {
	return func(ctx context.Context, s ScaleSizes, p ScalePoint, smp *ScaleSample) (err error) {
		e := scaleEnv(s, s.TopicMsgs)
		start := time.Now()
		rig, err := setup(ctx, p.Topics, e)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		smp.Setup, smp.CreateTopics = time.Since(start), rig.createTopics
		defer closeInto(&err, rig.close)
		smp.afterSetup(s)
		cpu0, t0 := cpuTime(), time.Now()
		for k := range e.n {
			if err := rig.send(ctx, k); err != nil {
				return err
			}
		}
		if rig.flush != nil {
			if err := rig.flush(); err != nil {
				return err
			}
		}
		if err := e.sink.wait(ctx); err != nil {
			return err
		}
		smp.Msgs, smp.Elapsed, smp.CPU = e.n, time.Since(t0), cpuTime()-cpu0
		if err := sleepCtx(ctx, s.Settle); err != nil {
			return err
		}
		cpu0, t0 = cpuTime(), time.Now()
		if err := sleepCtx(ctx, s.Idle); err != nil {
			return err
		}
		smp.Idle, smp.IdleCPU = time.Since(t0), cpuTime()-cpu0
		if seen := e.sink.seen.Load(); seen != int64(e.n) {
			return fmt.Errorf("handled %d messages, sent %d", seen, e.n)
		}
		return nil
	}
}

// ferryTopics: topics "t-<i>" of one queue with default retention, each
// with a push consumer of group "g" with default options, created and
// started one after the other.
func ferryTopics(ctx context.Context, topics int, e *env) (_ *topicRig, err error) {
	b, err := ferry.NewBroker()
	if err != nil {
		return nil, err
	}
	r := &ferryRig{b: b}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	msgs := make([]ferry.Message, topics)
	start := time.Now()
	for i := range msgs {
		msgs[i] = ferry.Message{Topic: "t-" + strconv.Itoa(i), Body: e.body}
		if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: msgs[i].Topic, Queues: 1}); err != nil {
			return nil, err
		}
	}
	created := time.Since(start)
	h := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		e.sink.handle(m.Body)
		return nil
	})
	for i := range msgs {
		c, err := b.NewConsumer("g", msgs[i].Topic, h)
		if err != nil {
			return nil, err
		}
		r.consumers = append(r.consumers, c)
		if err := c.Start(ctx); err != nil {
			return nil, err
		}
	}
	p, err := b.NewProducer()
	if err != nil {
		return nil, err
	}
	return &topicRig{
		send: func(ctx context.Context, k int) error {
			_, err := p.Send(ctx, &msgs[k%topics])
			return err
		},
		close:        func() error { return errors.Join(p.Close(), r.close()) },
		createTopics: created,
	}, nil
}

// chanTopics: a channel of capacity chanCap per topic, each drained by a
// goroutine of its own.
func chanTopics(_ context.Context, topics int, e *env) (*topicRig, error) {
	chans := make([]chan *chanMsg, topics)
	var wg sync.WaitGroup
	for i := range chans {
		ch := make(chan *chanMsg, chanCap)
		chans[i] = ch
		wg.Go(func() {
			for m := range ch {
				e.sink.handle(m.body)
			}
		})
	}
	var once sync.Once
	return &topicRig{
		send: func(_ context.Context, k int) error {
			chans[k%topics] <- &chanMsg{seq: k, body: e.body}
			return nil
		},
		close: func() error {
			once.Do(func() {
				for _, ch := range chans {
					close(ch)
				}
			})
			wg.Wait()
			return nil
		},
	}, nil
}

// watermillTopics: one GoChannel, a subscription per topic, each with its
// own loop (as in workload 3).
func watermillTopics(ctx context.Context, topics int, e *env) (*topicRig, error) {
	names := make([]string, topics)
	for i := range names {
		names[i] = "t-" + strconv.Itoa(i)
	}
	ps, stop, err := watermillPubSub(context.WithoutCancel(ctx), e, names)
	if err != nil {
		return nil, err
	}
	return &topicRig{
		send: func(_ context.Context, k int) error {
			return ps.Publish(names[k%topics], newWatermillMessage(e.body))
		},
		close: stop,
	}, nil
}

// natsTopics: NATS core, one subscriber connection with an asynchronous
// subscription per subject (each has its own goroutine in nats.go), and a
// publisher connection.
func natsTopics(_ context.Context, topics int, e *env) (_ *topicRig, err error) {
	srv, err := startNATS(e, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, srv.close())
		}
	}()
	nc, err := srv.connect()
	if err != nil {
		return nil, err
	}
	handler := func(m *nats.Msg) { e.sink.handle(m.Data) }
	subs := make([]string, topics)
	for i := range subs {
		subs[i] = "t." + strconv.Itoa(i)
		sub, err := nc.Subscribe(subs[i], handler)
		if err != nil {
			return nil, err
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			return nil, err
		}
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	pub, err := srv.connect()
	if err != nil {
		return nil, err
	}
	return &topicRig{
		send:  func(_ context.Context, k int) error { return pub.Publish(subs[k%topics], e.body) },
		flush: func() error { return cmpOr(pub.Flush(), srv.asyncErr()) },
		close: func() error { return cmpOr(srv.asyncErr(), srv.close()) },
	}, nil
}

// Workload 7: paced.

// pacedPoint runs a latency trial (workload 4's) paced by sleeping (see
// sink.paceSleep), latency taken from each send.
func pacedPoint(setup func(ctx context.Context, e *env) (*trial, error)) scaleFunc {
	return func(ctx context.Context, s ScaleSizes, _ ScalePoint, smp *ScaleSample) error {
		e := scaleEnv(s, s.PacedN)
		slab := make([]byte, e.n*s.BodyBytes)
		e.bodies = make([][]byte, e.n)
		for i := range e.bodies {
			b := slab[i*s.BodyBytes : (i+1)*s.BodyBytes : (i+1)*s.BodyBytes]
			copy(b, e.body)
			binary.LittleEndian.PutUint64(b, uint64(i))
			e.bodies[i] = b
		}
		e.sink.lat = make([]time.Duration, e.n)
		e.sink.sentAt = make([]time.Duration, e.n)
		e.sink.every = time.Second / time.Duration(s.PacedRate)
		t, err := setup(ctx, e)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		smp.afterSetup(s)
		cpu0, t0 := cpuTime(), time.Now()
		err = t.run(ctx)
		smp.Msgs, smp.Elapsed, smp.CPU = e.n, time.Since(t0), cpuTime()-cpu0
		if err := finish(Case{Workload: WorkloadPaced}, e, t, err); err != nil {
			return err
		}
		lat := e.sink.lat[latencyWarmup(e.n):]
		slices.Sort(lat)
		smp.P50, smp.P99, smp.P999 = percentile(lat, 0.50), percentile(lat, 0.99), percentile(lat, 0.999)
		return nil
	}
}

// Workload 8: backlog.

// backlog is a system that keeps messages with no consumer.
type backlog struct {
	// send keeps message i with the given body.
	send func(ctx context.Context, i int, body []byte) error
	// check reports a backlog that does not hold every message; nil if
	// the system offers no way to tell.
	check func(n int) error
	close func() error
}

// backlogPoint: the bodies are allocated first, in one slab, so that the
// heap growth from sending them is what the system keeps beyond them.
func backlogPoint(setup func(ctx context.Context, e *env) (*backlog, error)) scaleFunc {
	return func(ctx context.Context, s ScaleSizes, _ ScalePoint, smp *ScaleSample) (err error) {
		e := scaleEnv(s, s.BacklogN)
		slab := make([]byte, e.n*s.BodyBytes)
		for i := range e.n {
			copy(slab[i*s.BodyBytes:], e.body)
		}
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		bl, err := setup(ctx, e)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		defer closeInto(&err, bl.close)
		for i := range e.n {
			if err := bl.send(ctx, i, slab[i*s.BodyBytes:(i+1)*s.BodyBytes:(i+1)*s.BodyBytes]); err != nil {
				return err
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		smp.Msgs = e.n
		smp.Retained = float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / float64(e.n)
		smp.HeapInuse, smp.Goroutines = int64(m1.HeapInuse), runtime.NumGoroutine()
		smp.RSS, _ = procMem()
		if s.OnSetup != nil {
			s.OnSetup()
		}
		gcs := make([]time.Duration, 3)
		for i := range gcs {
			t0 := time.Now()
			runtime.GC()
			gcs[i] = time.Since(t0)
		}
		slices.Sort(gcs)
		smp.GC = gcs[1]
		runtime.KeepAlive(slab)
		if bl.check != nil {
			return bl.check(e.n)
		}
		return nil
	}
}

// ferryBacklog: one queue keeping every message (DropOldest with bounds
// of at least n, as workload 1's "retain all"), in the default memory
// storage.
func ferryBacklog(ctx context.Context, e *env) (_ *backlog, err error) {
	b, err := ferry.NewBroker()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	ret := ferry.Retention{MaxMessages: int64(max(e.n, ferry.DefaultRetentionMessages)), MaxBytes: ferry.Unlimited}
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: "backlog", Queues: 1, Retention: ret}); err != nil {
		return nil, err
	}
	p, err := b.NewProducer()
	if err != nil {
		return nil, err
	}
	m := ferry.Message{Topic: "backlog"}
	return &backlog{
		send: func(ctx context.Context, _ int, body []byte) error {
			m.Body = body
			_, err := p.Send(ctx, &m)
			return err
		},
		check: func(n int) error {
			q, err := b.Queue("backlog", 0)
			if err != nil {
				return err
			}
			if oldest, next := q.Offsets(); oldest != 0 || next != int64(n) {
				return fmt.Errorf("backlog holds offsets [%d, %d), want [0, %d)", oldest, next, n)
			}
			return nil
		},
		close: func() error { return errors.Join(p.Close(), b.Close()) },
	}, nil
}

// chanBacklog: a channel of capacity n, made after the baseline so that
// its buffer counts.
func chanBacklog(_ context.Context, e *env) (*backlog, error) {
	ch := make(chan *chanMsg, e.n)
	return &backlog{
		send: func(_ context.Context, i int, body []byte) error {
			ch <- &chanMsg{seq: i, body: body}
			return nil
		},
		check: func(n int) error {
			if len(ch) != n {
				return fmt.Errorf("channel holds %d messages, want %d", len(ch), n)
			}
			return nil
		},
		close: func() error { return nil },
	}, nil
}

// watermillBacklog: a persistent GoChannel (Persistent: true keeps every
// published message in memory, for subscribers to come) with no
// subscriber. It is not checked: a new subscriber would replay the
// backlog with a goroutine per message.
func watermillBacklog(_ context.Context, _ *env) (*backlog, error) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: chanCap, Persistent: true}, watermill.NopLogger{})
	return &backlog{
		send: func(_ context.Context, _ int, body []byte) error {
			return ps.Publish("backlog", newWatermillMessage(body))
		},
		close: ps.Close,
	}, nil
}

// Workload 9: rebalance.

// rebalancePoint follows the core's BenchmarkRebalanceUnderLoad: a topic
// of RebalanceQueues queues kept full by a producer (round robin; here
// each queue bounded at RebalanceBacklog messages with Overflow Block, so
// that the heap stays flat), a member "m2" with RebalanceWorkers workers
// running a CPU-bound handler, then Joins times a member "m1-<i>" (which
// sorts first, so the default allocator gives it half the queues) joins:
// the time is from NewConsumer until Start returns, which it does once
// the joiner holds the queues of its first assignment. The joiner then
// leaves and, before the next join, the owner takes every queue back.
func rebalancePoint(ctx context.Context, s ScaleSizes, _ ScalePoint, smp *ScaleSample) (err error) {
	b, err := ferry.NewBroker()
	if err != nil {
		return err
	}
	defer closeInto(&err, b.Close)
	const topic = "rebalance"
	ret := ferry.Retention{MaxMessages: int64(s.RebalanceBacklog), Overflow: ferry.Block}
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: topic, Queues: s.RebalanceQueues, Retention: ret}); err != nil {
		return err
	}
	p, err := b.NewProducer(ferry.WithRouter(ferry.RoundRobinRouter()))
	if err != nil {
		return err
	}
	defer closeInto(&err, p.Close)
	pctx, stopProducer := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		sendErr error
	)
	defer wg.Wait()
	defer stopProducer()
	wg.Go(func() {
		m := &ferry.Message{Topic: topic, Body: make([]byte, s.BodyBytes)}
		for pctx.Err() == nil {
			if _, err := p.Send(pctx, m); err != nil && pctx.Err() == nil {
				sendErr = err
				return
			}
		}
	})
	var sink int64
	var sinkMu sync.Mutex
	spin := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		x := int64(0)
		for i := range s.RebalanceSpin {
			x += int64(i) * int64(i)
		}
		sinkMu.Lock()
		sink += x
		sinkMu.Unlock()
		return nil
	})
	owner, err := b.NewConsumer("g", topic, spin, ferry.WithMemberID("m2"), ferry.WithConcurrency(s.RebalanceWorkers))
	if err != nil {
		return err
	}
	defer closeInto(&err, owner.Close)
	if err := owner.Start(ctx); err != nil {
		return err
	}
	if err := sleepCtx(ctx, 200*time.Millisecond); err != nil { // let the backlog and the workers get busy
		return err
	}
	smp.afterSetup(s)
	lo, hi := s.RebalanceQueues/2, (s.RebalanceQueues+1)/2
	smp.Held = s.RebalanceQueues
	for i := range s.Joins {
		t0 := time.Now()
		joiner, err := b.NewConsumer("g", topic, spin, ferry.WithMemberID("m1-"+strconv.Itoa(i)), ferry.WithConcurrency(s.RebalanceWorkers))
		if err != nil {
			return err
		}
		err = joiner.Start(ctx)
		took := time.Since(t0)
		held := len(joiner.Assigned())
		if err := errors.Join(err, joiner.Close()); err != nil {
			return fmt.Errorf("join %d: %w", i, err)
		}
		if held < lo || held > hi {
			return fmt.Errorf("join %d: the joiner held %d of %d queues once started", i, held, s.RebalanceQueues)
		}
		smp.Joins = append(smp.Joins, took)
		smp.Held = min(smp.Held, held)
		for len(owner.Assigned()) < s.RebalanceQueues { // the owner takes its queues back
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return fmt.Errorf("join %d: the owner holds %d of %d queues after the joiner left: %w", i, len(owner.Assigned()), s.RebalanceQueues, err)
			}
		}
	}
	if owner.Stats().Handled == 0 {
		return errors.New("the owner handled no message")
	}
	stopProducer()
	wg.Wait()
	return sendErr
}
