package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/ferrymq/ferry"
)

// The queue suite's concurrent cases: writers and readers at once, with
// and without retention.

func (s *queueSuite) concurrent(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	const writers, batches, readers = 6, 30, 2
	type landed struct {
		first int64
		msgs  []*ferry.EnhancedMessage
	}
	total := int64(0)
	for b := range batches {
		total += int64(1 + b%3)
	}
	total *= writers

	// A failed writer stops the readers, which would wait for ever.
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	readLogs := make([][]*ferry.EnhancedMessage, readers)
	readErrs := make([]error, readers)
	var rwg sync.WaitGroup
	for i := range readers {
		rwg.Go(func() {
			dst := make([]*ferry.EnhancedMessage, 7)
			for off := int64(0); off < total; {
				n, err := q.Read(ctx, off, dst)
				if err != nil {
					readErrs[i] = fmt.Errorf("reader %d: Read at %d: %w", i, off, err)
					return
				}
				readLogs[i] = append(readLogs[i], dst[:n]...)
				off += int64(n)
			}
		})
	}

	// Offsets, watched meanwhile, never move back.
	watchErr := make(chan error, 1)
	go func() {
		var lastOldest, lastNext int64
		for lastNext < total && ctx.Err() == nil {
			oldest, next := q.Offsets()
			if oldest < lastOldest || next < lastNext || oldest > next {
				watchErr <- fmt.Errorf("Offsets() went from %d, %d to %d, %d", lastOldest, lastNext, oldest, next)
				return
			}
			lastOldest, lastNext = oldest, next
			runtime.Gosched()
		}
		watchErr <- nil
	}()

	written := make([][]landed, writers)
	writeErrs := make([]error, writers)
	var wwg sync.WaitGroup
	for i := range writers {
		wwg.Go(func() {
			for b := range batches {
				batch := newMessages(i*1000+b*10, 1+b%3)
				first, err := q.Write(w.ctx, batch)
				if err != nil {
					writeErrs[i] = fmt.Errorf("writer %d: batch %d: %w", i, b, err)
					cancel()
					return
				}
				written[i] = append(written[i], landed{first, batch})
			}
		})
	}
	wwg.Wait()
	rwg.Wait()
	must(t, errors.Join(writeErrs...), "concurrent Write")
	must(t, errors.Join(readErrs...), "concurrent Read")
	must(t, <-watchErr, "Offsets during concurrent writes")

	wantOffsets(t, q, 0, total)
	log := readRange(t, w.ctx, q, 0, total, 50)
	owner := make([]bool, total)
	for i, ls := range written {
		last := int64(-1)
		for b, l := range ls {
			if l.first <= last {
				t.Fatalf("writer %d: batch %d landed at %d, before its previous batch at %d", i, b, l.first, last)
			}
			last = l.first
			for j, m := range l.msgs {
				off := l.first + int64(j)
				if off >= total || owner[off] {
					t.Fatalf("writer %d: batch %d: offset %d given twice or out of [0, %d)", i, b, off, total)
				}
				owner[off] = true
				if d := sameMessage(log[off], m); d != "" {
					t.Fatalf("writer %d: batch %d message %d, at offset %d: %s", i, b, j, off, d)
				}
			}
		}
	}
	for i, rl := range readLogs {
		if len(rl) != len(log) {
			t.Fatalf("reader %d saw %d messages, want %d", i, len(rl), len(log))
		}
		for off := range rl {
			if d := sameMessage(rl[off], log[off]); d != "" {
				t.Fatalf("reader %d, offset %d: %s", i, off, d)
			}
		}
	}
}

func (s *queueSuite) concurrentRetention(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{MaxMessages: 8})
	const writers, writes, readers = 2, 150, 3
	total := int64(0)
	for j := range writes {
		total += int64(1 + j%2)
	}
	total *= writers
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	errs := make([]error, writers+readers)
	var wg, wwg sync.WaitGroup
	wrote := make(chan struct{}, 1) // a write returned since the laggard last looked
	for i := range writers {
		wwg.Go(func() {
			for j := range writes {
				if _, err := q.Write(ctx, newMessages(i*1000+j*2, 1+j%2)); err != nil {
					errs[i] = fmt.Errorf("writer %d: %w", i, err)
					cancel()
					return
				}
				w.progress() // each write may roll and drop a segment: slow on a disk
				select {
				case wrote <- struct{}{}:
				default:
				}
			}
		})
	}
	// A laggard keeps reading at 0 while the writers drop it: at full
	// speed while 0 is retained, then once per write (0 never comes back,
	// and spinning on it took a core and the queue's lock from the
	// writers).
	writing := make(chan struct{})
	var laggardErr error
	wg.Go(func() {
		dst := make([]*ferry.EnhancedMessage, 2)
		for {
			select {
			case <-writing:
				return
			default:
			}
			n, err := q.Read(ctx, 0, dst)
			switch {
			case errors.Is(err, ferry.ErrOffsetOutOfRange):
				select {
				case <-wrote:
				case <-writing:
					return
				}
			case err != nil:
				laggardErr = fmt.Errorf("laggard: Read at 0: %w", err)
				cancel()
				return
			case dst[0] == nil || dst[0].Offset != 0:
				laggardErr = fmt.Errorf("laggard: Read at 0 returned %d messages, the first at offset %v", n, offsetOf(dst[0]))
				cancel()
				return
			}
		}
	})
	for i := range readers {
		wg.Go(func() {
			dst := make([]*ferry.EnhancedMessage, 1+i)
			for off := int64(0); off < total; {
				n, err := q.Read(ctx, off, dst)
				if errors.Is(err, ferry.ErrOffsetOutOfRange) {
					oldest, _ := q.Offsets()
					if oldest <= off {
						errs[writers+i] = fmt.Errorf("reader %d: Read at %d: %w, yet the oldest offset is %d", i, off, err, oldest)
						cancel()
						return
					}
					off = oldest // fell behind: catch up
					continue
				}
				if err != nil {
					errs[writers+i] = fmt.Errorf("reader %d: Read at %d: %w", i, off, err)
					cancel()
					return
				}
				for _, m := range dst[:n] {
					if m == nil || m.Offset != off {
						errs[writers+i] = fmt.Errorf("reader %d: Read from %d returned offset %v where %d belongs", i, off-int64(slices.Index(dst, m)), offsetOf(m), off)
						cancel()
						return
					}
					off++
				}
				w.progress()
			}
		})
	}
	wwg.Wait()
	close(writing)
	wg.Wait()
	must(t, errors.Join(append(errs, laggardErr)...), "reads racing retention")
	oldest, next := q.Offsets()
	if next != total || next-oldest < 8 || (s.f.RetentionExact && next-oldest != 8) {
		t.Fatalf("Offsets() = %d, %d after %d messages with retention 8", oldest, next, total)
	}
}
