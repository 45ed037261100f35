package ferry_test

import (
	"context"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// BenchmarkSendAsync compares one goroutine's Send with its SendAsync
// (then one Flush) on the same store: memory, and filestore under
// SyncAlways, where the asynchronous sends in flight share fdatasyncs.
// msgs/s is reported; compare the pairs of one run:
//
//	go test -run '^$' -bench 'SendAsync' -benchtime 2s .
func BenchmarkSendAsync(b *testing.B) {
	for _, store := range []string{"memory", "filestore-SyncAlways"} {
		for _, mode := range []string{"Send", "SendAsync"} {
			b.Run(store+"/"+mode, func(b *testing.B) {
				var br *ferry.Broker
				if store == "memory" {
					br = newBroker(b, 1)
				} else {
					st, err := filestore.Open(b.TempDir(), filestore.WithSync(filestore.SyncAlways))
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = st.Close() })
					br = newBroker(b, 1, ferry.WithStorage(st), ferry.WithCursorStore(st))
				}
				p := newProducer(b, br)
				ctx := context.Background()
				m := &ferry.Message{Topic: "orders", Body: benchBody}
				var failed error
				done := func(_ ferry.SendResult, err error) {
					if err != nil {
						failed = err
					}
				}
				b.ReportAllocs()
				b.SetBytes(int64(len(benchBody)))
				for b.Loop() {
					var err error
					if mode == "Send" {
						_, err = p.Send(ctx, m)
					} else {
						err = p.SendAsync(ctx, m, done)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if err := p.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				if failed != nil {
					b.Fatal(failed)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
