package natsstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// BenchmarkDrainFormat drains three backlogs of drainN messages on the
// single server with the same raw pull consumer as BenchmarkDrain's raw
// side (consumeRaw): "raw", drainBody-byte bodies as PublishAsync
// stores them; "ferry-stream", the stream a Ferry producer's SendBatch
// of 100 fills through natsstore (each record the encoded envelope, and
// the headers JetStream keeps: Nats-Msg-Id, Nats-Batch-Id,
// Nats-Batch-Sequence); "hdrs", raw bodies of the envelope's size with
// three headers of the same sizes under other names (no batch). It tells
// what reading Ferry's stored records costs any nats.go reader, before
// Ferry's own reader and consumer (nats.go decodes every message's
// headers into a map in its read loop):
//
//	go test -run '^$' -bench DrainFormat -benchtime 5x
func BenchmarkDrainFormat(b *testing.B) {
	c := singleServer(b)
	js := c.connect(b)
	var raw, fer, hdr time.Duration
	for range b.N {
		w, _ := drainRawFormat(b, js, drainBody, false)
		raw += w
		w, size := drainFerryStream(b, js)
		fer += w
		w, _ = drainRawFormat(b, js, size, true)
		hdr += w
	}
	n := float64(drainN * b.N)
	b.ReportMetric(n/raw.Seconds(), "raw-msgs/s")
	b.ReportMetric(n/fer.Seconds(), "ferry-stream-msgs/s")
	b.ReportMetric(n/hdr.Seconds(), "hdrs-msgs/s")
	b.ReportMetric(raw.Seconds()/fer.Seconds(), "ferry-stream/raw")
	b.ReportMetric(raw.Seconds()/hdr.Seconds(), "hdrs/raw")
}

// drainRawFormat fills a stream of its own with drainN bodies of size
// bytes, with Ferry's three header sizes if hdrs, and drains it; it
// returns the drain's time and size.
func drainRawFormat(b *testing.B, js jetstream.JetStream, size int, hdrs bool) (time.Duration, int) {
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("df%d", fresh.Add(1))
	defer dropNow(b, js, name)
	subject := name + ".raw"
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_raw", Subjects: []string{subject}, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, size)
	for sent := 0; sent < drainN; sent += 1000 { // below PublishAsync's window
		for i := range 1000 {
			m := nats.NewMsg(subject)
			m.Data = body
			if hdrs { // the sizes of Nats-Batch-Id, Nats-Batch-Sequence, Nats-Msg-Id
				m.Header.Set("Xats-Batch-Id", "LCizmyl94iirINep863mNr")
				m.Header.Set("Xats-Batch-Sequence", fmt.Sprint(i%100+1))
				m.Header.Set("Xats-Msg-Id", fmt.Sprintf("%032x", sent+i))
			}
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("raw publishes never acknowledged")
		}
	}
	w, _ := consumeRaw(ctx, b, s)
	return w, size
}

// drainFerryStream fills a fresh deployment's one-queue topic as
// drainFerry does and drains its stream raw; it returns the drain's
// time and the size of a stored record's data.
func drainFerryStream(b *testing.B, js jetstream.JetStream) (time.Duration, int) {
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("df%d", fresh.Add(1))
	defer dropNow(b, js, prefix)
	st, err := natsstore.Open(ctx, js, natsstore.WithPrefix(prefix), natsstore.WithOpTimeout(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	br, err := ferry.NewBroker(ferry.WithStorage(st))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	fillBacklog(ctx, b, br)
	var s jetstream.Stream
	for n := range js.StreamNames(ctx).Name() {
		if strings.HasPrefix(n, prefix) && strings.Contains(n, "bench") {
			if s, err = js.Stream(ctx, n); err != nil {
				b.Fatal(err)
			}
		}
	}
	if s == nil {
		b.Fatal("no stream of the topic")
	}
	rm, err := s.GetMsg(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	w, _ := consumeRaw(ctx, b, s)
	return w, len(rm.Data)
}
