package filestore_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/ferrymq/ferry/filestore"
)

var benchMeta = ferry.TopicMeta{Name: "bench", Queues: 1, Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}

func benchMsg() *ferry.EnhancedMessage {
	return &ferry.EnhancedMessage{Message: ferry.Message{Topic: benchMeta.Name, Body: make([]byte, 100)}}
}

func reportRate(b *testing.B, msgs int) {
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(msgs)/s, "msgs/s")
	b.ReportMetric(float64(msgs)*100/s/1e6, "MB/s")
}

// BenchmarkWrite writes one 100-byte message per Write from one goroutine,
// under each sync policy.
func BenchmarkWrite(b *testing.B) {
	for _, p := range []filestore.SyncPolicy{filestore.SyncAlways, filestore.SyncEvery(10 * time.Millisecond), filestore.SyncNever} {
		b.Run(p.String(), func(b *testing.B) {
			st, err := filestore.Open(b.TempDir(), filestore.WithSync(p))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			q, err := st.OpenQueue(context.Background(), benchMeta, 0)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				if _, err := q.Write(ctx, []*ferry.EnhancedMessage{benchMsg()}); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b, b.N)
		})
	}
}

// BenchmarkWriteBatch100 writes 100 messages of 100 bytes per Write from
// one goroutine under SyncAlways: one frame, one write, one fdatasync.
func BenchmarkWriteBatch100(b *testing.B) {
	st, err := filestore.Open(b.TempDir(), filestore.WithSync(filestore.SyncAlways))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	q, err := st.OpenQueue(context.Background(), benchMeta, 0)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	batch := make([]*ferry.EnhancedMessage, 100)
	b.ResetTimer()
	for range b.N {
		for i := range batch {
			batch[i] = benchMsg()
		}
		if _, err := q.Write(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, b.N*len(batch))
}

// BenchmarkGroupCommit64 writes one 100-byte message per Write from 64
// goroutines under SyncAlways: they share writes and fdatasyncs.
func BenchmarkGroupCommit64(b *testing.B) {
	st, err := filestore.Open(b.TempDir(), filestore.WithSync(filestore.SyncAlways))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	q, err := st.OpenQueue(context.Background(), benchMeta, 0)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const writers = 64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		n := b.N / writers
		if w < b.N%writers {
			n++
		}
		wg.Go(func() {
			for range n {
				if _, err := q.Write(ctx, []*ferry.EnhancedMessage{benchMsg()}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	reportRate(b, b.N)
}

// BenchmarkRecovery measures Open of a store holding one queue of
// FILESTORE_RECOVERY_BYTES (default 1 GiB) of 100-byte messages, by
// default (the newest segment is read) and with WithVerify (every frame
// is read). Run it by hand:
//
//	go test -run '^$' -bench Recovery -benchtime 3x ./filestore/
func BenchmarkRecovery(b *testing.B) {
	total := int64(1 << 30)
	if s := os.Getenv("FILESTORE_RECOVERY_BYTES"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		total = v
	}
	dir := b.TempDir()
	st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever))
	if err != nil {
		b.Fatal(err)
	}
	q, err := st.OpenQueue(context.Background(), benchMeta, 0)
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]*ferry.EnhancedMessage, 1000)
	var written int64
	for written < total {
		for i := range batch {
			batch[i] = benchMsg()
		}
		if _, err := q.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
		written += int64(len(batch)) * int64(codec.Size(batch[0]))
	}
	_, next := q.Offsets()
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	b.Logf("queue of %d messages, about %d MiB", next, written>>20)
	for _, c := range []struct {
		name string
		opts []filestore.Option
	}{{"newest-segment", nil}, {"verify-all", []filestore.Option{filestore.WithVerify()}}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				st, err := filestore.Open(dir, c.opts...)
				if err != nil {
					b.Fatal(err)
				}
				q, err := st.OpenQueue(context.Background(), benchMeta, 0)
				if err != nil {
					b.Fatal(err)
				}
				if _, n := q.Offsets(); n != next {
					b.Fatalf("recovered %d messages of %d", n, next)
				}
				if err := st.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(written)/1e6/(b.Elapsed().Seconds()/float64(b.N)), "MB/s")
		})
	}
}

// BenchmarkRead reads 100-byte messages in batches of 64 from the tail
// cache and, with the cache off, from disk (page cache) through the index.
func BenchmarkRead(b *testing.B) {
	for _, c := range []struct {
		name string
		opt  filestore.Option
	}{{"cache", filestore.WithCache(1<<20, 1<<30)}, {"disk", filestore.WithCache(0, 0)}} {
		b.Run(c.name, func(b *testing.B) {
			st, err := filestore.Open(b.TempDir(), filestore.WithSync(filestore.SyncNever), c.opt)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			q, err := st.OpenQueue(ctx, benchMeta, 0)
			if err != nil {
				b.Fatal(err)
			}
			const total = 100_000
			batch := make([]*ferry.EnhancedMessage, 100)
			for range total / len(batch) {
				for i := range batch {
					batch[i] = benchMsg()
				}
				if _, err := q.Write(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			dst := make([]*ferry.EnhancedMessage, 64)
			b.ResetTimer()
			read := 0
			for off := int64(0); read < b.N; {
				n, err := q.Read(ctx, off, dst[:min(len(dst), b.N-read)])
				if err != nil {
					b.Fatal(err)
				}
				read += n
				off = (off + int64(n)) % total
			}
			reportRate(b, b.N)
		})
	}
}
