package filestore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// backlogStore writes a queue of n 100-byte messages in segments of
// segBytes to a fresh directory and returns it, closed.
func backlogStore(b *testing.B, n int, segBytes int64) string {
	b.Helper()
	dir := b.TempDir()
	st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever), filestore.WithSegmentBytes(segBytes))
	if err != nil {
		b.Fatal(err)
	}
	q, err := st.OpenQueue(context.Background(), benchMeta, 0)
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]*ferry.EnhancedMessage, 500)
	for written := 0; written < n; written += len(batch) {
		for i := range batch {
			batch[i] = benchMsg()
		}
		if _, err := q.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkReadColdBacklog reads a backlog of about 600 sealed segments
// (256 KiB each, 2^20 messages of 100-byte bodies) from the first offset to the last
// after a reopen, with the message cache off and the segments dropped
// from the page cache first where the platform allows (posix_fadvise), so
// every read goes to the segment files: the case a descriptor cache
// bounded below the number of segments must not slow down.
func BenchmarkReadColdBacklog(b *testing.B) {
	const total = 1 << 20
	dir := backlogStore(b, total, 256<<10)
	segs, _ := filepath.Glob(filepath.Join(dir, "topics", benchMeta.Name, "0", "*.log"))
	b.Logf("%d segments", len(segs))
	ctx := context.Background()
	dst := make([]*ferry.EnhancedMessage, 256)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for _, s := range segs {
			dropPageCache(b, s)
		}
		st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever), filestore.WithCache(0, 0))
		if err != nil {
			b.Fatal(err)
		}
		q, err := st.OpenQueue(ctx, benchMeta, 0)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for off := int64(0); off < total; {
			n, err := q.Read(ctx, off, dst)
			if err != nil {
				b.Fatal(err)
			}
			off += int64(n)
		}
		b.StopTimer()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportRate(b, b.N*total)
}

// BenchmarkOpenSmallSegments opens a store whose queue holds about 60
// small segments and reports what Open allocates.
func BenchmarkOpenSmallSegments(b *testing.B) {
	dir := backlogStore(b, 28*40, 4<<10)
	segs, _ := filepath.Glob(filepath.Join(dir, "topics", benchMeta.Name, "0", "*.log"))
	b.Logf("%d segments", len(segs))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever), filestore.WithSegmentBytes(4<<10))
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// dropPageCache asks the kernel to drop name's pages from the page cache.
func dropPageCache(b *testing.B, name string) {
	f, err := os.Open(name)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fadviseDontNeed(f)
}
