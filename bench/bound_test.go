package bench

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// The BenchmarkBound benchmarks measure the primitives that bound the
// targets a workload misses on this machine (see README.md): what a clock
// read, an envelope allocation, a lock, a handoff and a write syscall
// cost, each alone.

var (
	sinkTime time.Time
	sinkDur  time.Duration
	sinkMsg  *ferry.EnhancedMessage
)

// BenchmarkBoundTimeNow: a wall and a monotonic clock read.
func BenchmarkBoundTimeNow(b *testing.B) {
	for b.Loop() {
		sinkTime = time.Now()
	}
}

// BenchmarkBoundMonotonic: a monotonic clock read alone (what Ferry's
// stamp costs between full readings).
func BenchmarkBoundMonotonic(b *testing.B) {
	base := time.Now()
	for b.Loop() {
		sinkDur = time.Since(base)
	}
}

// BenchmarkBoundEnvelope: allocating an EnhancedMessage per message, the
// newest 65,536 kept alive as in a bounded queue, so that the GC's work
// is counted too.
func BenchmarkBoundEnvelope(b *testing.B) {
	ring := make([]*ferry.EnhancedMessage, 1<<16)
	body := make([]byte, 100)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		m := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "bench", Body: body}}
		ring[i&(len(ring)-1)] = m
		i++
	}
	sinkMsg = ring[0]
}

// BenchmarkBoundChanMsg: the same for the Go channel peer's 32-byte
// message.
func BenchmarkBoundChanMsg(b *testing.B) {
	ring := make([]*chanMsg, 1<<16)
	body := make([]byte, 100)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		ring[i&(len(ring)-1)] = &chanMsg{seq: i, body: body}
		i++
	}
}

// BenchmarkBoundMutex: an uncontended lock and unlock.
func BenchmarkBoundMutex(b *testing.B) {
	var mu sync.Mutex
	for b.Loop() {
		mu.Lock()
		//lint:ignore SA2001 the empty critical section is what this benchmark measures
		mu.Unlock()
	}
}

// BenchmarkBoundPwrite: one 150-byte write system call (a 100-byte
// message and its framing) into the page cache.
func BenchmarkBoundPwrite(b *testing.B) {
	f, err := os.CreateTemp(b.TempDir(), "pwrite")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 150)
	off := int64(0)
	for b.Loop() {
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		off += int64(len(buf))
	}
}

// BenchmarkBoundHopPwrite: a synchronous request to a writer goroutine
// that makes the write and answers, the least a one-writer-goroutine
// store costs per acknowledged write.
func BenchmarkBoundHopPwrite(b *testing.B) {
	f, err := os.CreateTemp(b.TempDir(), "pwrite")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 150)
	reqs, done := make(chan int64), make(chan error)
	var wg sync.WaitGroup
	wg.Go(func() {
		for off := range reqs {
			_, err := f.WriteAt(buf, off)
			done <- err
		}
	})
	off := int64(0)
	for b.Loop() {
		reqs <- off
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		off += int64(len(buf))
	}
	close(reqs)
	wg.Wait()
}
