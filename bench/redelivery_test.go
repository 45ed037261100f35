package bench

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry"
)

// BenchmarkRedeliveryDelay compares, in one run, how late a message comes
// back after it asked to wait redeliveryWait:
//
//   - jetstream nak: the first delivery is nak'ed with
//     msg.NakWithDelay(redeliveryWait) (nats-server embedded, memory
//     stream, durable pull consumer with explicit acks, Consume);
//   - ferry retry: the handler fails the first attempt with
//     ferry.RetryAfter(err, redeliveryWait) (memory storage, a concurrent
//     push consumer: the retry goes through the group's retry topic and
//     a delay level);
//   - ferry deliverat: the message is sent with DeliverAt now +
//     redeliveryWait (no failure).
//
// Lateness is the time the handler gets the message again minus the time
// the first handler returned (or called Nak) plus the wait; for DeliverAt
// it is the receive time minus the due time (ferry.HeaderDeliverAt).
// Messages are published for one second at 100/s and at 1,000/s (the
// sub-benchmarks), one at a time, so the waits overlap. Early counts
// messages that came back before their time. A run of the three lasts
// about 4 s for each rate.
//
//	go test -run x -bench RedeliveryDelay -benchtime 1x
func BenchmarkRedeliveryDelay(b *testing.B) {
	for _, r := range []redelivery{{n: 100, every: 10 * time.Millisecond}, {n: 1000, every: time.Millisecond}} {
		b.Run("rate="+strconv.Itoa(r.n)+"/s", func(b *testing.B) { benchRedelivery(b, r) })
	}
}

// redelivery is a run: n messages, one every every.
type redelivery struct {
	n     int
	every time.Duration
}

func benchRedelivery(b *testing.B, r redelivery) {
	systems := []struct {
		name string
		run  func(b *testing.B, r redelivery) (late []time.Duration, early int)
	}{
		{"jetstream-nak", jsNakLateness},
		{"ferry-retry", func(b *testing.B, r redelivery) ([]time.Duration, int) { return ferryLateness(b, r, false) }},
		{"ferry-deliverat", func(b *testing.B, r redelivery) ([]time.Duration, int) { return ferryLateness(b, r, true) }},
	}
	late := make([][]time.Duration, len(systems))
	early := make([]int, len(systems))
	for b.Loop() {
		for i, s := range systems { // interleaved: drift hits them alike
			l, e := s.run(b, r)
			late[i] = append(late[i], l...)
			early[i] += e
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for i, s := range systems {
		l := late[i]
		slices.Sort(l)
		b.ReportMetric(ms(l[len(l)/2]), s.name+"-p50-ms")
		b.ReportMetric(ms(l[len(l)*99/100]), s.name+"-p99-ms")
		b.ReportMetric(ms(l[len(l)-1]), s.name+"-max-ms")
		b.ReportMetric(float64(early[i]), s.name+"-early")
	}
	b.ReportMetric(0, "ns/op")
}

const redeliveryWait = 100 * time.Millisecond

// lateness collects the lateness of n messages by index.
type lateness struct {
	n     int
	mu    sync.Mutex
	fail  map[int]time.Time // when the first delivery failed
	late  []time.Duration
	early int
	seen  map[int]bool
	all   chan struct{}
}

func newLateness(n int) *lateness {
	return &lateness{n: n, fail: map[int]time.Time{}, seen: map[int]bool{}, all: make(chan struct{})}
}

// failed records that message i failed at now; false if it had failed
// before (a later delivery to measure).
func (l *lateness) failed(i int, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.fail[i]; ok {
		return false
	}
	l.fail[i] = now
	return true
}

// back records message i back at now, due at due.
func (l *lateness) back(i int, now, due time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[i] {
		return
	}
	l.seen[i] = true
	d := now.Sub(due)
	if d < 0 {
		l.early++
	}
	l.late = append(l.late, d)
	if len(l.late) == l.n {
		close(l.all)
	}
}

func (l *lateness) wait(b *testing.B, what string) ([]time.Duration, int) {
	select {
	case <-l.all:
	case <-time.After(30 * time.Second):
		l.mu.Lock()
		defer l.mu.Unlock()
		b.Fatalf("%s: %d of %d messages back after 30 s", what, len(l.late), l.n)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.late), l.early
}

// pace calls send(i) for i in [0, r.n), one every r.every.
func pace(b *testing.B, r redelivery, send func(i int) error) {
	tick := time.NewTicker(r.every)
	defer tick.Stop()
	for i := range r.n {
		<-tick.C
		if err := send(i); err != nil {
			b.Fatal(err)
		}
	}
}

func jsNakLateness(b *testing.B, r redelivery) ([]time.Duration, int) {
	ns, err := server.NewServer(&server.Options{DontListen: true, NoLog: true, NoSigs: true, JetStream: true, StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "delay", Subjects: []string{"delay.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: -1})
	if err != nil {
		b.Fatal(err)
	}
	l := newLateness(r.n)
	var errMu sync.Mutex
	var asyncErr error
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		now := time.Now()
		i, err := strconv.Atoi(string(msg.Data()))
		if err == nil {
			if l.failed(i, now) {
				err = msg.NakWithDelay(redeliveryWait)
			} else {
				l.mu.Lock()
				due := l.fail[i].Add(redeliveryWait)
				l.mu.Unlock()
				l.back(i, now, due)
				err = msg.Ack()
			}
		}
		if err != nil {
			errMu.Lock()
			asyncErr = cmpOr(asyncErr, err)
			errMu.Unlock()
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	pace(b, r, func(i int) error {
		_, err := js.Publish(ctx, "delay.x", []byte(strconv.Itoa(i)))
		return err
	})
	late, early := l.wait(b, "jetstream nak")
	errMu.Lock()
	defer errMu.Unlock()
	if asyncErr != nil {
		b.Fatal(asyncErr)
	}
	return late, early
}

// ferryLateness runs Ferry's retry (deliverAt false) or DeliverAt case.
func ferryLateness(b *testing.B, r redelivery, deliverAt bool) ([]time.Duration, int) {
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "delay", Queues: 1}); err != nil {
		b.Fatal(err)
	}
	l := newLateness(r.n)
	c, err := br.NewConsumer("g", "delay", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		now := time.Now()
		i, err := strconv.Atoi(string(m.Body))
		if err != nil {
			return ferry.Permanent(err)
		}
		if deliverAt {
			ns, err := strconv.ParseInt(m.Headers[ferry.HeaderDeliverAt], 10, 64)
			if err != nil {
				return ferry.Permanent(err)
			}
			l.back(i, now, time.Unix(0, ns))
			return nil
		}
		if l.failed(i, now) {
			return ferry.RetryAfter(errors.New("not yet"), redeliveryWait)
		}
		l.mu.Lock()
		due := l.fail[i].Add(redeliveryWait)
		l.mu.Unlock()
		l.back(i, now, due)
		return nil
	}), ferry.WithRetry(3, redeliveryWait))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	p, err := br.NewProducer()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	pace(b, r, func(i int) error {
		m := &ferry.Message{Topic: "delay", Body: []byte(strconv.Itoa(i))}
		if deliverAt {
			m.DeliverAt = time.Now().Add(redeliveryWait)
		}
		_, err := p.Send(ctx, m)
		return err
	})
	what := "ferry retry"
	if deliverAt {
		what = "ferry deliverat"
	}
	return l.wait(b, what)
}
