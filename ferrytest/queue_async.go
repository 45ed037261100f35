package ferrytest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ferrymq/ferry"
)

// writeAsync checks a queue that is a [ferry.AsyncWriter]: writes begun
// one after another from one goroutine are stored in that order, done is
// called once per write in that order with the write's first offset and
// the messages stamped; a bad batch and a nil ctx are refused through
// done, in order with the others; Close with writes in flight reports
// every one of them before it returns.
func (s *queueSuite) writeAsync(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	aw, ok := q.(ferry.AsyncWriter)
	if !ok {
		t.Skip("not an AsyncWriter")
	}
	type outcome struct {
		k     int
		first int64
		err   error
	}
	var mu sync.Mutex
	var got []outcome
	var wg sync.WaitGroup
	begin := func(ctx context.Context, k int, msgs []*ferry.EnhancedMessage) {
		wg.Add(1)
		var once sync.Once
		aw.WriteAsync(ctx, msgs, func(first int64, err error) {
			called := false
			once.Do(func() { called = true })
			if !called {
				t.Errorf("done of write %d called twice", k)
				return
			}
			mu.Lock()
			got = append(got, outcome{k, first, err})
			mu.Unlock()
			wg.Done()
		})
	}
	const writes = 20
	var batches [][]*ferry.EnhancedMessage
	seq := 0
	for k := range writes {
		n := 1 + k%4
		msgs := newMessages(seq, n)
		seq += n
		batches = append(batches, msgs)
		switch k {
		case 5:
			begin(w.ctx, k, []*ferry.EnhancedMessage{newMessage(-1), nil}) // bad: refused
		case 9:
			begin(nil, k, newMessages(-1, 1)) // a nil ctx: refused
		default:
			begin(w.ctx, k, msgs)
		}
	}
	wg.Wait()
	if len(got) != writes {
		t.Fatalf("%d writes reported, want %d", len(got), writes)
	}
	var want []*ferry.EnhancedMessage
	next := int64(0)
	for i, o := range got {
		if o.k != i {
			t.Fatalf("write %d reported in place %d: done is called in the order the writes began", o.k, i)
		}
		switch o.k {
		case 5:
			wantErr(t, o.err, ferry.ErrInvalidMessage, "WriteAsync of a batch with a nil message")
			continue
		case 9:
			wantErr(t, o.err, ferry.ErrInvalidOption, "WriteAsync with a nil ctx")
			continue
		}
		must(t, o.err, fmt.Sprintf("WriteAsync %d", o.k))
		if o.first != next {
			t.Fatalf("write %d: first offset %d, want %d (stored in the order begun)", o.k, o.first, next)
		}
		for j, m := range batches[o.k] {
			if m.Offset != next+int64(j) || m.Queue != suiteQueue {
				t.Fatalf("write %d message %d stamped %v/%d, want queue %d offset %d", o.k, j, m.Queue, m.Offset, suiteQueue, next+int64(j))
			}
		}
		next += int64(len(batches[o.k]))
		want = append(want, batches[o.k]...)
	}
	wantMessages(t, readRange(t, w.ctx, q, 0, next, 7), want)

	// Close with writes in flight: each is reported before Close returns.
	got = nil
	for k := range writes {
		begin(w.ctx, k, newMessages(1000+k, 2))
	}
	must(t, q.Close(), "Close with writes in flight")
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != writes {
		t.Fatalf("Close returned with %d of %d writes reported", n, writes)
	}
	for i, o := range got {
		if o.k != i {
			t.Fatalf("write %d reported in place %d", o.k, i)
		}
	}
	after := make(chan error, 1)
	aw.WriteAsync(w.ctx, newMessages(2000, 1), func(_ int64, err error) { after <- err })
	wantErr(t, <-after, ferry.ErrClosed, "WriteAsync after Close")
}
