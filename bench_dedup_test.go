package ferry_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// The cost of deduplication: Send and SendBatch with a DedupKey on every
// message against without, over memory and filestore (SyncNever, so the
// disk does not hide the CPU cost). Every key is new (the window holds
// them all, as a sustained stream within a window does), but for the
// key-10ms cases, whose window of 10 ms keeps the window small (the
// steady state of a short window); keys are made before the timer.
// Compare the plain and key sub-benchmarks' ns/op.

func dedupBenchBroker(b *testing.B, store string, window time.Duration) *ferry.Broker {
	b.Helper()
	var opts []ferry.BrokerOption
	if store == "filestore" {
		st, err := filestore.Open(b.TempDir(), filestore.WithSync(filestore.SyncNever))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() }) // after the broker's
		opts = append(opts, ferry.WithStorage(st))
	}
	br, err := ferry.NewBroker(opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Close() })
	meta := ferry.TopicMeta{Name: "orders", Queues: 1, DedupWindow: window} // default retention, as an application has
	if err := br.CreateTopic(context.Background(), meta); err != nil {
		b.Fatal(err)
	}
	return br
}

var dedupBenchCases = []struct {
	name   string
	keyed  bool
	window time.Duration
}{{"plain", false, 0}, {"key", true, 0}, {"key-10ms", true, 10 * time.Millisecond}}

// dedupKeys returns n distinct keys, cut from one string: one object for
// the garbage collector, as the messages share one body (benchBody), so
// that the keyed cases measure the keys' cost in Ferry, not the GC's
// marking of the benchmark's own n strings.
func dedupKeys(n int) []string {
	var sb strings.Builder
	ends := make([]int, n)
	for i := range ends {
		sb.WriteString("order-")
		sb.WriteString(strconv.Itoa(i))
		ends[i] = sb.Len()
	}
	all := sb.String()
	keys := make([]string, n)
	start := 0
	for i, end := range ends {
		keys[i], start = all[start:end], end
	}
	return keys
}

func BenchmarkSendDedup(b *testing.B) {
	for _, store := range []string{"memory", "filestore"} {
		for _, c := range dedupBenchCases {
			keyed := c.keyed
			b.Run(store+"/"+c.name, func(b *testing.B) {
				ctx := context.Background()
				br := dedupBenchBroker(b, store, c.window)
				p := newProducer(b, br)
				var keys []string
				if keyed {
					keys = dedupKeys(b.N)
				}
				msgs := make([]ferry.Message, b.N) // a message per Send: the producer keeps it
				for i := range msgs {
					msgs[i] = ferry.Message{Topic: "orders", Body: benchBody}
					if keyed {
						msgs[i].DedupKey = keys[i]
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					r, err := p.Send(ctx, &msgs[i])
					if err != nil || r.Duplicate {
						b.Fatal(err, r.Duplicate)
					}
				}
			})
		}
	}
}

// BenchmarkSendBatchDedup sends batches of 100; ns/op is per batch.
func BenchmarkSendBatchDedup(b *testing.B) {
	const size = 100
	for _, store := range []string{"memory", "filestore"} {
		for _, c := range dedupBenchCases {
			keyed := c.keyed
			b.Run(store+"/"+c.name, func(b *testing.B) {
				ctx := context.Background()
				br := dedupBenchBroker(b, store, c.window)
				p := newProducer(b, br)
				var keys []string
				if keyed {
					keys = dedupKeys(b.N * size)
				}
				batches := make([][]*ferry.Message, b.N)
				for i := range batches {
					batches[i] = make([]*ferry.Message, size)
					for j := range batches[i] {
						m := &ferry.Message{Topic: "orders", Body: benchBody}
						if keyed {
							m.DedupKey = keys[i*size+j]
						}
						batches[i][j] = m
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if _, err := p.SendBatch(ctx, batches[i]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
