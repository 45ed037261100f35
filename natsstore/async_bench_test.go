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

// The sizes of BenchmarkSendAsync (issue 30, item 5): asyncN messages of
// asyncBody bytes, at most asyncWindow in flight (PublishAsync's default
// window, and the producer's WithMaxInFlight).
const (
	asyncN      = 50_000
	asyncBody   = 100
	asyncWindow = 4000
)

// BenchmarkSendAsync sends asyncN messages of asyncBody bytes from one
// goroutine with at most asyncWindow in flight, on the single server
// (R1) and the 3-node cluster (R3): Ferry's Producer.SendAsync (then
// Flush) to a one-queue topic over natsstore, and raw PublishAsync to a
// stream of its own, like natsbench's "ferry async" case. Each
// iteration does both, alternating which goes first, so that both see
// the same load; it reports both rates, their ratio and the process's
// CPU time per message (the servers run in this process):
//
//	go test -run '^$' -bench SendAsync -benchtime 5x
func BenchmarkSendAsync(b *testing.B) {
	for _, r := range []int{1, 3} {
		b.Run(fmt.Sprintf("R%d", r), func(b *testing.B) {
			c := singleServer(b)
			if r == 3 {
				c = tripleServer(b)
			}
			js := c.connect(b)
			var fe, ra, fcpu, rcpu time.Duration
			for i := range b.N {
				if i%2 == 1 {
					w, u := sendRawAsync(b, js, r)
					ra, rcpu = ra+w, rcpu+u
				}
				w, u := sendFerryAsync(b, js, r)
				fe, fcpu = fe+w, fcpu+u
				if i%2 == 0 {
					w, u := sendRawAsync(b, js, r)
					ra, rcpu = ra+w, rcpu+u
				}
			}
			n := float64(asyncN * b.N)
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

func asyncBodyBytes() []byte {
	body := make([]byte, asyncBody)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	return body
}

// sendFerryAsync sends asyncN messages with SendAsync to a fresh
// deployment's one-queue topic; it returns the time from the first
// send to Flush's return and the process's CPU time meanwhile.
func sendFerryAsync(b *testing.B, js jetstream.JetStream, replicas int) (time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("sa%d", fresh.Add(1))
	defer dropNow(b, js, prefix)
	st, err := natsstore.Open(ctx, js, natsstore.WithPrefix(prefix), natsstore.WithReplicas(replicas), natsstore.WithOpTimeout(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	br, err := ferry.NewBroker(ferry.WithStorage(st))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	ret := ferry.Retention{MaxMessages: asyncN, MaxBytes: ferry.Unlimited}
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "bench", Queues: 1, Retention: ret}); err != nil {
		b.Fatal(err)
	}
	p, err := br.NewProducer(ferry.WithMaxInFlight(asyncWindow))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	body := asyncBodyBytes()
	var failed atomic.Int64
	done := func(_ ferry.SendResult, err error) {
		if err != nil {
			failed.Add(1)
		}
	}
	cpu, start := cpuTime(), time.Now()
	for range asyncN {
		if err := p.SendAsync(ctx, &ferry.Message{Topic: "bench", Body: body}, done); err != nil {
			b.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	w, u := time.Since(start), cpuTime()-cpu
	if k := failed.Load(); k > 0 {
		b.Fatalf("%d async sends failed", k)
	}
	return w, u
}

// sendRawAsync publishes asyncN messages with PublishAsync (its default
// window) to a stream of its own; it returns the time from the first
// publish to the last ack and the process's CPU time meanwhile.
func sendRawAsync(b *testing.B, js jetstream.JetStream, replicas int) (time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("sa%d", fresh.Add(1))
	defer dropNow(b, js, name)
	subject := name + ".raw"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_raw", Subjects: []string{subject}, Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
		b.Fatal(err)
	}
	body := asyncBodyBytes()
	futures := make([]jetstream.PubAckFuture, 0, asyncN)
	cpu, start := cpuTime(), time.Now()
	for range asyncN {
		f, err := js.PublishAsync(subject, body, jetstream.WithStallWait(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("raw publishes never acknowledged")
	}
	w, u := time.Since(start), cpuTime()-cpu
	for _, f := range futures {
		select {
		case <-f.Ok():
		case <-f.Err():
			b.Fatal("a raw publish failed")
		}
	}
	return w, u
}
