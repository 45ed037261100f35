package bench

import (
	"context"
	"sync"
)

// chanCap is the capacity of the channels of the Go channel peer and of
// Watermill's output channels: a bounded buffer between producer and
// consumer, as Ferry's consumer buffer is.
const chanCap = 1024

// chanMsg is the Go channel peer's message: a fresh one per send, as a
// user's would be, sharing the read-only body.
type chanMsg struct {
	seq  int
	body []byte
}

// chanCases is the floor for a handoff in Go: a buffered channel of
// message pointers (of batches in workload 2).
func chanCases() []Case {
	return []Case{
		{Workload: 1, System: "chan", Name: "go chan", messages: allN, setup: chanSingle},
		{Workload: 2, System: "chan", Name: "go chan of batches", messages: allN, setup: chanBatch},
		{Workload: 3, System: "chan", Name: "go chan", messages: allN, setup: chanGroup},
		{Workload: 4, System: "chan", Name: "go chan", messages: latencyN, setup: chanLatency},
	}
}

func chanSingle(_ context.Context, e *env) (*trial, error) { return chanOne(e, false), nil }

func chanLatency(_ context.Context, e *env) (*trial, error) { return chanOne(e, true), nil }

// chanOne is one producer and one consumer over one channel; paced sends
// at the offered rate of the latency workload.
func chanOne(e *env, paced bool) *trial {
	ch := make(chan *chanMsg, chanCap)
	var wg sync.WaitGroup
	wg.Go(func() {
		for m := range ch {
			e.sink.handle(m.body)
		}
	})
	var once sync.Once
	stop := func() { once.Do(func() { close(ch) }) }
	return &trial{
		run: func(ctx context.Context) error {
			var err error
			if paced {
				err = e.sink.pace(ctx, e.n, func(i int) error {
					ch <- &chanMsg{seq: i, body: e.bodies[i]}
					return nil
				})
			} else {
				for i := range e.n {
					ch <- &chanMsg{seq: i, body: e.body}
				}
			}
			stop()
			if err != nil {
				return err
			}
			return e.sink.wait(ctx)
		},
		close: func() error { stop(); wg.Wait(); return nil },
	}
}

func chanBatch(_ context.Context, e *env) (*trial, error) {
	ch := make(chan []chanMsg, max(1, chanCap/e.Batch))
	var wg sync.WaitGroup
	wg.Go(func() {
		for batch := range ch {
			for i := range batch {
				e.sink.handle(batch[i].body)
			}
		}
	})
	var once sync.Once
	stop := func() { once.Do(func() { close(ch) }) }
	return &trial{
		run: func(ctx context.Context) error {
			for i := 0; i < e.n; i += e.Batch {
				batch := make([]chanMsg, min(e.Batch, e.n-i))
				for j := range batch {
					batch[j] = chanMsg{seq: i + j, body: e.bodyOf(i + j)}
				}
				ch <- batch
			}
			stop()
			return e.sink.wait(ctx)
		},
		close: func() error { stop(); wg.Wait(); return nil },
	}, nil
}

// chanGroup: producers send round robin over Queues channels; consumer c
// owns the channels i with i%Consumers == c and selects over them.
func chanGroup(_ context.Context, e *env) (*trial, error) {
	chans := make([]chan *chanMsg, e.Queues)
	for i := range chans {
		chans[i] = make(chan *chanMsg, chanCap)
	}
	var wg sync.WaitGroup
	for c := range e.Consumers {
		var own []chan *chanMsg
		for i := c; i < len(chans); i += e.Consumers {
			own = append(own, chans[i])
		}
		wg.Go(func() { drain(own, e.sink) })
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			for _, ch := range chans {
				close(ch)
			}
		})
	}
	return &trial{
		run: func(ctx context.Context) error {
			var pw sync.WaitGroup
			for p := range e.Producers {
				pw.Go(func() {
					q := p
					for i := range split(e.n, e.Producers, p) {
						chans[q%len(chans)] <- &chanMsg{seq: i, body: e.body}
						q++
					}
				})
			}
			pw.Wait()
			stop()
			return e.sink.wait(ctx)
		},
		close: func() error { stop(); wg.Wait(); return nil },
	}, nil
}

// drain handles the messages of chans until all are closed: a plain
// receive for one channel, a select for two, reflect-free round robin for
// more.
func drain(chans []chan *chanMsg, s *sink) {
	switch len(chans) {
	case 0:
	case 1:
		for m := range chans[0] {
			s.handle(m.body)
		}
	case 2:
		a, b := chans[0], chans[1]
		for a != nil || b != nil {
			select {
			case m, ok := <-a:
				if !ok {
					a = nil
					continue
				}
				s.handle(m.body)
			case m, ok := <-b:
				if !ok {
					b = nil
					continue
				}
				s.handle(m.body)
			}
		}
	default:
		var wg sync.WaitGroup
		for _, ch := range chans {
			wg.Go(func() { drain([]chan *chanMsg{ch}, s) })
		}
		wg.Wait()
	}
}
