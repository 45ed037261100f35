package natsstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// The drain benchmark's sizes (issue 30, item 4): a backlog of drainN
// messages of drainBody bytes in one queue; the raw consumer acks every
// rawAckEvery messages.
const (
	drainN      = 20_000
	drainBody   = 128
	rawAckEvery = 100
)

// BenchmarkDrain drains a backlog of 20,000 × 128 B in one queue (one
// stream, file storage) with one Ferry consumer over natsstore (store,
// cursor store and coordinator; committing at its default cadence) and
// with a raw nats.go pull consumer (Consume, its default pull sizes; ack
// policy all, an ack every rawAckEvery messages and at the last), like
// for like, on the single server (R1) and the 3-node cluster (R3).
// Each iteration drains one backlog with each, Ferry first; each
// figure is from the start of the consumer until the last message is
// handled. It reports both rates and their ratio, and the process's CPU
// time per message over the same spans (the servers run in this process,
// so it counts theirs too; on a loaded host it varies less than the
// rates):
//
//	go test -run '^$' -bench Drain -benchtime 5x
func BenchmarkDrain(b *testing.B) {
	for _, r := range []int{1, 3} {
		b.Run(fmt.Sprintf("R%d", r), func(b *testing.B) {
			c := singleServer(b)
			if r == 3 {
				c = tripleServer(b)
			}
			js := c.connect(b)
			var fe, ra, fcpu, rcpu time.Duration
			for range b.N {
				w, u := drainFerry(b, c, js, r)
				fe, fcpu = fe+w, fcpu+u
				w, u = drainRaw(b, js, r)
				ra, rcpu = ra+w, rcpu+u
			}
			n := float64(drainN * b.N)
			b.ReportMetric(n/fe.Seconds(), "ferry-msgs/s")
			b.ReportMetric(n/ra.Seconds(), "raw-msgs/s")
			b.ReportMetric(ra.Seconds()/fe.Seconds(), "ferry/raw")
			if fcpu > 0 && rcpu > 0 {
				b.ReportMetric(float64(fcpu.Nanoseconds())/n, "ferry-cpu-ns/msg")
				b.ReportMetric(float64(rcpu.Nanoseconds())/n, "raw-cpu-ns/msg")
			}
		})
	}
}

func drainBodyBytes() []byte {
	body := make([]byte, drainBody)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	return body
}

// drainFerry fills a fresh deployment's one-queue topic and drains it
// with one consumer; it returns the drain's time and the process's CPU
// time meanwhile.
func drainFerry(b *testing.B, c *cluster, js jetstream.JetStream, replicas int) (time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("dr%d", fresh.Add(1))
	defer dropNow(b, js, prefix)
	opts := []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithReplicas(replicas), natsstore.WithOpTimeout(10 * time.Second)}
	st, err := natsstore.Open(ctx, js, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	co, err := natsstore.NewCoordinator(ctx, js, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer co.Close()
	br, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	fillBacklog(ctx, b, br)
	var n atomic.Int64
	done := make(chan struct{})
	cons, err := br.NewConsumer("g", "bench", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		if n.Add(1) == drainN {
			close(done)
		}
		return nil
	}))
	if err != nil {
		b.Fatal(err)
	}
	defer cons.Close()
	cpu, start := cpuTime(), time.Now()
	if err := cons.Start(ctx); err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("ferry drained %d of %d", n.Load(), drainN)
	}
	return time.Since(start), cpuTime() - cpu
}

// drainRaw fills a stream of its own and drains it with a durable pull
// consumer; it returns the drain's time and the process's CPU time
// meanwhile.
func drainRaw(b *testing.B, js jetstream.JetStream, replicas int) (time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("dr%d", fresh.Add(1))
	defer dropNow(b, js, name)
	subject := name + ".raw"
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_raw", Subjects: []string{subject}, Storage: jetstream.FileStorage, Replicas: replicas})
	if err != nil {
		b.Fatal(err)
	}
	body := drainBodyBytes()
	for sent := 0; sent < drainN; sent += 1000 { // below PublishAsync's window
		for range 1000 {
			if _, err := js.PublishAsync(subject, body); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("raw publishes never acknowledged")
		}
	}
	return consumeRaw(ctx, b, s)
}

// consumeRaw drains drainN messages of s with a durable pull consumer
// acking every rawAckEvery; it returns the drain's time and the
// process's CPU time meanwhile.
func consumeRaw(ctx context.Context, b *testing.B, s jetstream.Stream) (time.Duration, time.Duration) {
	var n atomic.Int64
	done := make(chan struct{})
	cpu, start := cpuTime(), time.Now()
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		b.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		k := n.Add(1)
		if k%rawAckEvery == 0 || k == drainN {
			_ = m.Ack()
		}
		if k == drainN {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("raw drained %d of %d", n.Load(), drainN)
	}
	return time.Since(start), cpuTime() - cpu
}

// dropNow deletes the streams and buckets of deployment prefix.
func dropNow(b *testing.B, js jetstream.JetStream, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dropStreams(ctx, js, prefix); err != nil {
		b.Error(err)
	}
}

// fillBacklog creates br's one-queue topic "bench" and sends it drainN
// messages of the drain's body, in batches of 100.
func fillBacklog(ctx context.Context, b *testing.B, br *ferry.Broker) {
	ret := ferry.Retention{MaxMessages: drainN, MaxBytes: ferry.Unlimited}
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "bench", Queues: 1, Retention: ret}); err != nil {
		b.Fatal(err)
	}
	p, err := br.NewProducer()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	body := drainBodyBytes()
	batch := make([]*ferry.Message, 100)
	for sent := 0; sent < drainN; sent += len(batch) {
		for i := range batch {
			batch[i] = &ferry.Message{Topic: "bench", Body: body}
		}
		if _, err := p.SendBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}
