package ferrytest

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// The queue suite's cases of retention: what a queue keeps and drops, and
// Block's back-pressure.

// retainer checks a queue's retention as it grows.
type retainer struct {
	t      *testing.T
	w      *watchdog
	q      ferry.Queue
	oldest int64
}

// check checks the offsets after next messages, of which the queue may
// drop all but keep; exact says it must keep exactly that many.
func (r *retainer) check(next, keep int64, exact bool) {
	t := r.t
	t.Helper()
	oldest, gotNext := r.q.Offsets()
	if gotNext != next {
		t.Fatalf("Offsets() next = %d after %d messages", gotNext, next)
	}
	if oldest < r.oldest {
		t.Fatalf("Offsets() oldest moved back from %d to %d", r.oldest, oldest)
	}
	r.oldest = oldest
	want := max(0, next-keep)
	switch {
	case exact && oldest != want:
		t.Fatalf("Offsets() = %d, %d; retention keeps %d, so want oldest %d", oldest, next, keep, want)
	case oldest > want:
		t.Fatalf("Offsets() = %d, %d: dropped more than retention allows (keeps %d, oldest at most %d)", oldest, next, keep, want)
	}
	if oldest < next {
		got := readRange(t, r.w.ctx, r.q, oldest, next, 64)
		if got[0].Offset != oldest {
			t.Fatalf("Read at the oldest offset %d returned offset %d", oldest, got[0].Offset)
		}
	}
	if oldest > 0 {
		_, err := r.q.Read(r.w.ctx, oldest-1, make([]*ferry.EnhancedMessage, 1))
		wantErr(t, err, ferry.ErrOffsetOutOfRange, fmt.Sprintf("Read at %d below the oldest %d", oldest-1, oldest))
	}
}

func (s *queueSuite) retention(t *testing.T, w *watchdog) {
	exact := s.f.RetentionExact
	t.Run("Messages", func(t *testing.T) {
		q := s.open(t, w, ferry.Retention{MaxMessages: 5})
		r := &retainer{t: t, w: w, q: q}
		next := int64(0)
		for range 3 {
			write(t, w, q, newMessages(int(next), 4))
			next += 4
			r.check(next, 5, exact)
		}
		for range 6 {
			write(t, w, q, newMessages(int(next), 1))
			next++
			r.check(next, 5, exact)
		}
	})
	t.Run("Bytes", func(t *testing.T) {
		q := s.open(t, w, ferry.Retention{MaxBytes: 100})
		r := &retainer{t: t, w: w, q: q}
		for next := int64(1); next <= 10; next++ {
			write(t, w, q, []*ferry.EnhancedMessage{sizedMessage(25)})
			r.check(next, 4, exact)
		}
	})
	t.Run("Unlimited", func(t *testing.T) {
		q := s.open(t, w, ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited})
		for i := range 4 {
			write(t, w, q, newMessages(i*100, 100))
		}
		wantOffsets(t, q, 0, 400)
		readRange(t, w.ctx, q, 0, 400, 64)
	})
	if !exact {
		return
	}
	t.Run("Age", func(t *testing.T) {
		q := s.open(t, w, ferry.Retention{MaxAge: time.Millisecond})
		write(t, w, q, newMessages(0, 2))
		// Wait, without sleeping, for the messages to age out.
		for {
			if oldest, next := q.Offsets(); oldest == next {
				if next != 2 {
					t.Fatalf("Offsets() next = %d after 2 messages", next)
				}
				break
			}
			if w.ctx.Err() != nil {
				oldest, next := q.Offsets()
				t.Fatalf("messages older than MaxAge %v are still retained: Offsets() = %d, %d", time.Millisecond, oldest, next)
			}
			runtime.Gosched()
		}
		_, err := q.Read(w.ctx, 0, make([]*ferry.EnhancedMessage, 1))
		wantErr(t, err, ferry.ErrOffsetOutOfRange, "Read of an aged-out offset")
	})
}

func (s *queueSuite) block(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{MaxMessages: 2, Overflow: ferry.Block})
	tw, ok := q.(ferry.TryWriter)
	if !ok {
		t.Fatalf("Features.Block is set but %T does not implement ferry.TryWriter", q)
	}
	rel, ok := q.(ferry.Releaser)
	if !ok {
		t.Fatalf("Features.Block is set but %T does not implement ferry.Releaser", q)
	}
	write(t, w, q, newMessages(0, 2))
	_, err := tw.TryWrite(newMessages(2, 1))
	wantErr(t, err, ferry.ErrQueueFull, "TryWrite on a full queue")
	_, err = tw.TryWrite(newMessages(2, 3))
	wantErr(t, err, ferry.ErrMessageTooLarge, "TryWrite of a batch larger than retention")
	wantOffsets(t, q, 0, 2)

	startWrite := func(ctx context.Context, m *ferry.EnhancedMessage) <-chan result {
		ch := make(chan result, 1)
		go func() {
			first, err := q.Write(ctx, []*ferry.EnhancedMessage{m})
			ch <- result{first, err}
		}()
		return ch
	}

	ch := startWrite(w.ctx, newMessage(2))
	wantPending(t, ch, "Write on a full queue")
	rel.Release(1)
	r := <-ch
	must(t, r.err, "Write after Release")
	if r.n != 2 {
		t.Fatalf("Write after Release returned offset %d, want 2", r.n)
	}
	wantOffsets(t, q, 1, 3)

	rel.Release(0) // lower than before: ignored
	_, err = tw.TryWrite(newMessages(3, 1))
	wantErr(t, err, ferry.ErrQueueFull, "TryWrite after a lower Release")

	ctx, cancel := context.WithCancel(w.ctx)
	ch = startWrite(ctx, newMessage(3))
	wantPending(t, ch, "Write on a full queue")
	cancel()
	wantErr(t, (<-ch).err, context.Canceled, "Write blocked when its context is cancelled")
	wantOffsets(t, q, 1, 3)

	ch = startWrite(w.ctx, newMessage(3))
	wantPending(t, ch, "Write on a full queue")
	must(t, q.Close(), "Close")
	wantErr(t, (<-ch).err, ferry.ErrClosed, "Write blocked when the queue is closed")
	_, err = tw.TryWrite(newMessages(3, 1))
	wantErr(t, err, ferry.ErrClosed, "TryWrite after Close")
	rel.Release(3) // must not panic
}
