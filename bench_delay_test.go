package ferry_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
)

// Benchmarks of delayed delivery (issue 15's figures). Each sub-benchmark
// does one whole run per iteration and reports its figures with
// b.ReportMetric, so -benchtime=1x runs each once; at the default
// benchtime the runs that last longer than a second also run once, the
// others (sends) as often as usual. Reproduce:
//
//	go test -run x -bench Delay -benchtime 1x

// delayBenchAll is unlimited retention: nothing is dropped while it waits.
var delayBenchAll = ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}

// BenchmarkDelayPendingMemory: N messages due hours from now (1 to 9
// hours, four delay levels) wait in a filestore; the figure is the live
// heap after GC, less the heap of the same broker with one message in each
// level, per pending message. It must not grow with N: the movers read a
// level only up to what is due within a window, and no message has a
// timer. The store's read cache (filestore.DefaultCacheMessages decoded
// messages per queue, at most DefaultCacheBytes) is part of the figure:
// a constant, so bytes/msg falls as N grows; "cache=off" shows the floor.
// The 1M points send in about a second each (SyncNever) and leave about
// 200 MB in a temporary directory while they run; -short leaves them out.
func BenchmarkDelayPendingMemory(b *testing.B) {
	sizes := []int{10_000, 100_000, 1_000_000}
	if testing.Short() {
		sizes = sizes[:2]
	}
	for _, cache := range []bool{true, false} {
		for _, n := range sizes {
			name := fmt.Sprintf("cache=on/n=%d", n)
			opts := []filestore.Option{filestore.WithSync(filestore.SyncNever)}
			if !cache {
				name = fmt.Sprintf("cache=off/n=%d", n)
				opts = append(opts, filestore.WithCache(0, 0))
			}
			b.Run(name, func(b *testing.B) {
				var perMsg, heapMB, goroutines float64
				for b.Loop() {
					perMsg, heapMB, goroutines = pendingHeap(b, n, opts)
				}
				b.ReportMetric(perMsg, "heap-B/pending-msg")
				b.ReportMetric(heapMB, "heap-MB")
				b.ReportMetric(goroutines, "goroutines-added")
			})
		}
	}
}

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// pendingHeap sends n messages due hours from now into a new filestore
// broker (the whole run is timed: ns/op is the time to set up and send
// them, and measure) and returns the heap they added per message, the whole heap in
// MB, and how many goroutines they added.
func pendingHeap(b *testing.B, n int, opts []filestore.Option) (perMsg, heapMB, goroutines float64) {
	ctx := context.Background()
	s, err := filestore.Open(b.TempDir(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	br, err := ferry.NewBroker(ferry.WithStorage(s), ferry.WithCursorStore(s))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 4, Retention: delayBenchAll}); err != nil {
		b.Fatal(err)
	}
	p, err := br.NewProducer()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	now := time.Now()
	// Warm up: one message in each level the run uses (waits of 1h to 9h
	// are levels 16 to 19), so the baseline holds the levels and movers.
	for _, h := range []time.Duration{1, 2, 4, 8} {
		if _, err := p.Send(ctx, &ferry.Message{Topic: "jobs", Body: benchBody, DeliverAt: now.Add(h*time.Hour + time.Minute)}); err != nil {
			b.Fatal(err)
		}
	}
	g0 := runtime.NumGoroutine()
	h0 := liveHeap()
	rng := rand.New(rand.NewPCG(uint64(n), 15))
	batch := make([]*ferry.Message, 0, 1000)
	for i := range n {
		at := now.Add(time.Hour + time.Duration(rng.Int64N(int64(8*time.Hour))))
		batch = append(batch, &ferry.Message{Topic: "jobs", Key: strconv.Itoa(i % 1000), Body: benchBody, DeliverAt: at})
		if len(batch) == cap(batch) || i == n-1 {
			if _, err := p.SendBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	batch = nil
	h1 := liveHeap()
	g1 := runtime.NumGoroutine()
	return (float64(h1) - float64(h0)) / float64(n), float64(h1) / (1 << 20), float64(g1 - g0)
}

// BenchmarkDelayLateness: messages fall due at a steady rate (10k/s and
// 100k/s, for one second), each sent with a delay of 0.1 to 2 s (so
// through levels 0 to 4), on the system clock over memory storage; a
// push consumer records receive time − HeaderDeliverAt. It reports the
// p50, p99 and max lateness, and fails if any message arrives early.
// brokers=3 runs three brokers over one storage, cursor store and
// coordinator, each with a producer sending a third of the messages and
// a member of the group: the delay levels' work is split among them.
// A run lasts about 3 s.
func BenchmarkDelayLateness(b *testing.B) {
	for _, bc := range []struct{ rate, brokers int }{{10_000, 1}, {100_000, 1}, {10_000, 3}, {100_000, 3}} {
		b.Run(fmt.Sprintf("rate=%dk/brokers=%d", bc.rate/1000, bc.brokers), func(b *testing.B) {
			rate := bc.rate
			var late []time.Duration
			early := 0
			for b.Loop() {
				l, e := latenessRun(b, rate, bc.brokers, time.Second)
				late = append(late, l...)
				early += e
			}
			if early > 0 {
				b.Fatalf("%d of %d messages delivered before their due time", early, len(late))
			}
			slices.Sort(late)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(late[len(late)/2]), "p50-ms")
			b.ReportMetric(ms(late[len(late)*99/100]), "p99-ms")
			b.ReportMetric(ms(late[len(late)-1]), "max-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// latenessRun runs rate·window messages due at rate from 2 s on, each
// sent its delay (0.1 to 2 s) before it is due, and returns their
// lateness and how many came early.
func latenessRun(b *testing.B, rate, brokers int, window time.Duration) ([]time.Duration, int) {
	ctx := context.Background()
	storage, cursors, coord := ferry.NewMemoryStorage(), ferry.NewMemoryCursorStore(), ferry.NewMemoryCoordinator()
	defer storage.Close()
	defer cursors.Close()
	defer coord.Close()
	bs := make([]*ferry.Broker, brokers)
	for i := range bs {
		br, err := ferry.NewBroker(ferry.WithStorage(storage), ferry.WithCursorStore(cursors), ferry.WithCoordinator(coord))
		if err != nil {
			b.Fatal(err)
		}
		defer br.Close()
		bs[i] = br
	}
	if err := bs[0].CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: 4, Retention: delayBenchAll, DedupWindow: ferry.DedupOff}); err != nil {
		b.Fatal(err)
	}
	n := int(int64(rate) * int64(window) / int64(time.Second))
	late := make([]time.Duration, n)
	var got, early atomic.Int64
	all := make(chan struct{})
	handler := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		now := time.Now()
		// A message the pacing sent after its due time went as a plain
		// one, without HeaderDeliverAt: the benchmark's own header.
		due, err := strconv.ParseInt(m.Headers["bench-due"], 10, 64)
		if err != nil {
			return ferry.Permanent(err)
		}
		d := now.Sub(time.Unix(0, due))
		if d < 0 {
			early.Add(1)
		}
		i := got.Add(1)
		if i <= int64(n) {
			late[i-1] = d
		}
		if i == int64(n) {
			close(all)
		}
		return nil
	})
	ps := make([]*ferry.Producer, brokers)
	for i, br := range bs {
		c, err := br.NewConsumer("g", "jobs", handler)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if ps[i], err = br.NewProducer(); err != nil {
			b.Fatal(err)
		}
		defer ps[i].Close()
	}
	turn := 0

	type plan struct{ send, due time.Time }
	t0 := time.Now().Add(10 * time.Millisecond)
	rng := rand.New(rand.NewPCG(uint64(rate), 15))
	plans := make([]plan, n)
	for i := range plans {
		due := t0.Add(2*time.Second + time.Duration(int64(i)*int64(time.Second)/int64(rate)))
		wait := 100*time.Millisecond + time.Duration(rng.Int64N(int64(1900*time.Millisecond)))
		plans[i] = plan{send: due.Add(-wait), due: due}
	}
	slices.SortFunc(plans, func(a, b plan) int { return a.send.Compare(b.send) })
	tick := time.NewTicker(time.Millisecond) // pacing: each tick sends what is due to be sent
	defer tick.Stop()
	batch := make([]*ferry.Message, 0, 1024)
	for i := 0; i < n; {
		<-tick.C
		now := time.Now()
		for i < n && !plans[i].send.After(now) {
			due := plans[i].due
			batch = append(batch, &ferry.Message{Topic: "jobs", Body: benchBody, DeliverAt: due,
				Headers: map[string]string{"bench-due": strconv.FormatInt(due.UnixNano(), 10)}})
			i++
			if len(batch) == cap(batch) {
				if _, err := ps[turn%brokers].SendBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
				turn++
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			if _, err := ps[turn%brokers].SendBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			turn++
			batch = batch[:0]
		}
	}
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		var where []string
		for lvl := range 32 {
			name := "%DELAY%" + strconv.Itoa(lvl)
			q, err := bs[0].Queue(name, 0)
			if err != nil {
				continue
			}
			oldest, next := q.Offsets()
			lag, _ := bs[0].Lag(ctx, "ferry-delay", name)
			where = append(where, fmt.Sprintf("%s [%d,%d) lag %d", name, oldest, next, lag.Lag))
		}
		jobs, _ := bs[0].Lag(ctx, "g", "jobs")
		b.Fatalf("rate %d: %d of %d messages delivered after 30 s; jobs lag %d; levels: %v", rate, got.Load(), n, jobs.Lag, where)
	}
	return late, int(early.Load())
}

// BenchmarkDelaySend compares sending delayed messages (due in an hour)
// with plain sends, in the same run, interleaved 100 and 100: ns/op is
// per pair (one plain, one delayed); the metrics are ns per message of
// each and their ratio. Memory storage; the broker is replaced (untimed)
// every 100k pairs so that the pending messages do not pile up.
func BenchmarkDelaySend(b *testing.B) {
	for _, batched := range []bool{false, true} {
		name := "Send"
		if batched {
			name = "SendBatch100"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			var br *ferry.Broker
			var p *ferry.Producer
			fresh := func() {
				if br != nil {
					_ = p.Close()
					_ = br.Close()
				}
				var err error
				if br, err = ferry.NewBroker(); err == nil {
					err = br.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1, Retention: delayBenchAll})
				}
				if err == nil {
					p, err = br.NewProducer()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			fresh()
			defer func() { _ = p.Close(); _ = br.Close() }()
			const chunk = 100
			plain := make([]*ferry.Message, chunk)
			delayed := make([]*ferry.Message, chunk)
			for i := range chunk {
				plain[i] = &ferry.Message{Topic: "orders", Body: benchBody}
				delayed[i] = &ferry.Message{Topic: "orders", Body: benchBody}
			}
			send := func(msgs []*ferry.Message) {
				if batched {
					if _, err := p.SendBatch(ctx, msgs); err != nil {
						b.Fatal(err)
					}
					return
				}
				for _, m := range msgs {
					if _, err := p.Send(ctx, m); err != nil {
						b.Fatal(err)
					}
				}
			}
			var tPlain, tDelayed time.Duration
			sent := 0
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(chunk, b.N-done)
				if sent >= 100_000 {
					b.StopTimer()
					fresh()
					sent = 0
					b.StartTimer()
				}
				at := time.Now().Add(time.Hour)
				for _, m := range delayed[:k] {
					m.DeliverAt = at
				}
				t0 := time.Now()
				send(plain[:k])
				t1 := time.Now()
				send(delayed[:k])
				t2 := time.Now()
				tPlain += t1.Sub(t0)
				tDelayed += t2.Sub(t1)
				done += k
				sent += k
			}
			b.ReportMetric(float64(tPlain)/float64(b.N), "plain-ns/msg")
			b.ReportMetric(float64(tDelayed)/float64(b.N), "delayed-ns/msg")
			b.ReportMetric(float64(tDelayed)/float64(tPlain), "delayed/plain")
		})
	}
}

// BenchmarkDelayDueMoves: a backlog of n messages, all due at the same
// instant an hour ahead, waits in a level (memory storage, fake clock);
// the clock is advanced an hour at once and the figure is how fast the
// broker moves them to their topic (messages/s, from the advance until
// the topic's queues hold all n; no consumer).
func BenchmarkDelayDueMoves(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				total += dueMoves(b, n)
			}
			b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "moves/s")
			b.ReportMetric(float64(total)/float64(n*b.N), "ns/move")
		})
	}
}

// dueMoves sends n messages due an hour ahead on a fake clock, advances
// it an hour, and returns how long the moves took. Only the moves are
// timed, so ns/op is the time to move the backlog.
func dueMoves(b *testing.B, n int) time.Duration {
	b.StopTimer()
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := ferrytest.NewFakeClock(start)
	br, err := ferry.NewBroker(ferry.WithClock(clock))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	const queues = 4
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "jobs", Queues: queues, Retention: delayBenchAll}); err != nil {
		b.Fatal(err)
	}
	p, err := br.NewProducer()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	due := start.Add(time.Hour)
	batch := make([]*ferry.Message, 0, 1000)
	for i := range n {
		batch = append(batch, &ferry.Message{Topic: "jobs", Key: strconv.Itoa(i), Body: benchBody, DeliverAt: due})
		if len(batch) == cap(batch) || i == n-1 {
			if _, err := p.SendBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	// The level's mover waits on the clock for its first message.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(wctx, 1); err != nil {
		b.Fatal("the mover does not wait on the clock: ", err)
	}
	qs := make([]ferry.ReadableQueue, queues)
	for i := range qs {
		if qs[i], err = br.Queue("jobs", i); err != nil {
			b.Fatal(err)
		}
	}
	stored := func() int64 {
		var s int64
		for _, q := range qs {
			_, next := q.Offsets()
			s += next
		}
		return s
	}
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	b.StartTimer()
	t0 := time.Now()
	clock.Advance(time.Hour)
	for stored() < int64(n) {
		select {
		case <-tick.C:
		case <-wctx.Done():
			b.Fatalf("%d of %d moved after 10 s", stored(), n)
		}
	}
	took := time.Since(t0)
	b.StopTimer() // the deferred closes are not timed
	defer b.StartTimer()
	return took
}
