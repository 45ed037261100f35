package filestore

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// BenchmarkTransactional measures a consumer whose handler sends one
// output per message: plainly (Producer.Send from the handler;
// plainkeyed: with a DedupKey, as the outbox's outputs have) or through
// the outbox of a ferry.Transactional consumer, in memory and on a store
// under SyncAlways (cursors in the store too), with 1 and 64 concurrent
// handlers. The input queue is filled before the timer
// starts; the timer stops when the b.N outputs are stored and the
// group's cursor is committed past every input. ns/op is per message;
// syncs/msg counts the store's fdatasyncs (and directory syncs) in the
// timed part per committed message. Compare plain and txn of one run
// (go test -run x -bench Transactional -count 3).
func BenchmarkTransactional(b *testing.B) {
	for _, storage := range []string{"memory", "SyncAlways"} {
		for _, conc := range []int{1, 64} {
			for _, mode := range []string{"plain", "plainkeyed", "txn"} {
				b.Run(storage+"/c"+strconv.Itoa(conc)+"/"+mode, func(b *testing.B) {
					benchTransactional(b, storage, conc, mode)
				})
			}
		}
	}
}

func benchTransactional(b *testing.B, storage string, conc int, mode string) {
	txn := mode == "txn"
	ctx := context.Background()
	var syncs atomic.Int64
	var counting atomic.Bool
	var opts []ferry.BrokerOption
	if storage != "memory" {
		st, err := Open(b.TempDir(), WithSync(SyncAlways), withFault(func(op, _ string) error {
			if (op == opSync || op == opSyncDir) && counting.Load() {
				syncs.Add(1)
			}
			return nil
		}))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		opts = append(opts, ferry.WithStorage(st), ferry.WithCursorStore(st))
	}
	br, err := ferry.NewBroker(opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	all := ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}
	for _, name := range []string{"in", "out"} {
		if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: name, Queues: 1, Retention: all}); err != nil {
			b.Fatal(err)
		}
	}
	p, err := br.NewProducer()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	msgs := make([]*ferry.Message, 1024)
	for i := range msgs {
		msgs[i] = &ferry.Message{Topic: "in", Body: []byte("0123456789abcdef0123456789abcdef")}
	}
	for sent := 0; sent < b.N; sent += len(msgs) {
		if _, err := p.SendBatch(ctx, msgs[:min(len(msgs), b.N-sent)]); err != nil {
			b.Fatal(err)
		}
	}
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		out := &ferry.Message{Topic: "out", Body: m.Body}
		if mode == "plainkeyed" {
			out.DedupKey = "in:" + strconv.FormatInt(m.Offset, 10)
		}
		if txn {
			return ferry.OutboxFrom(ctx).Send(out)
		}
		_, err := p.Send(ctx, out)
		return err
	})
	copts := []ferry.ConsumerOption{ferry.WithConcurrency(conc), ferry.WithStartFrom(ferry.Earliest)}
	if txn {
		copts = append(copts, ferry.Transactional())
	}
	c, err := br.NewConsumer("g", "in", h, copts...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	q, err := br.Queue("out", 0)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	counting.Store(true)
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for {
		if _, next := q.Offsets(); next >= int64(b.N) {
			lag, err := br.Lag(ctx, "g", "in")
			if err != nil {
				b.Fatal(err)
			}
			if lag.Lag == 0 {
				break
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	counting.Store(false)
	if storage != "memory" {
		b.ReportMetric(float64(syncs.Load())/float64(b.N), "syncs/msg")
	}
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	if _, next := q.Offsets(); next != int64(b.N) {
		b.Fatalf("%d outputs for %d messages", next, b.N)
	}
}
