package ferry_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// BenchmarkResetToTime finds, by time, the offset in the middle of a
// queue of a million messages: one op is one ResetGroup, on memory and on
// filestore (binary search over reads; no scan).
func BenchmarkResetToTime(b *testing.B) {
	const n = 1 << 20
	for _, name := range []string{"memory", "filestore"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			var opts []ferry.BrokerOption
			if name == "filestore" {
				st, err := filestore.Open(b.TempDir(), filestore.WithSync(filestore.SyncNever))
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
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}); err != nil {
				b.Fatal(err)
			}
			p, err := br.NewProducer()
			if err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 100)
			batch := make([]*ferry.Message, 1024)
			var mid time.Time
			for i := 0; i < n; i += len(batch) {
				for j := range batch {
					batch[j] = &ferry.Message{Topic: "t", Body: body}
				}
				if i == n/2 {
					mid = time.Now()
				}
				if _, err := p.SendBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := br.ResetGroup(ctx, "g", "t", ferry.ResetToTime(mid)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
