package ferrytest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// openWindow is open with a DedupWindow: a fresh queue of the suite's
// topic, of default retention and the given window.
func (s *queueSuite) openWindow(t *testing.T, w *watchdog, window time.Duration) ferry.Queue {
	t.Helper()
	meta := suiteMeta(ferry.Retention{})
	meta.DedupWindow = window
	q := s.newQueue(t, meta, suiteQueue)
	if q == nil {
		t.Fatal("ferrytest: the queue factory returned nil")
	}
	w.closeOnHang(q)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// keyedMessage is newMessage(seq) carrying dedup key key.
func keyedMessage(seq int, key string) *ferry.EnhancedMessage {
	m := newMessage(seq)
	m.DedupKey = key
	return m
}

// writeDedup writes msgs and returns the first offset and which of msgs
// the queue reports as duplicates.
func writeDedup(t *testing.T, w *watchdog, q ferry.Queue, msgs []*ferry.EnhancedMessage) (int64, []bool) {
	t.Helper()
	first := write(t, w, q, msgs)
	return first, duplicates(first, msgs)
}

func duplicates(first int64, msgs []*ferry.EnhancedMessage) []bool {
	dup := make([]bool, len(msgs))
	ferry.Duplicates(first, msgs, func(i int) { dup[i] = true })
	return dup
}

// wantDuplicate fails t unless dup carries where orig was stored.
func wantDuplicate(t *testing.T, what string, dup, orig *ferry.EnhancedMessage) {
	t.Helper()
	switch {
	case dup.Offset != orig.Offset:
		t.Fatalf("%s: duplicate reported at offset %d, the first is at %d", what, dup.Offset, orig.Offset)
	case dup.ID != orig.ID:
		t.Fatalf("%s: duplicate reported with ID %s, the first has %s", what, dup.ID, orig.ID)
	case dup.Queue != orig.Queue:
		t.Fatalf("%s: duplicate reported in queue %d, the first is in %d", what, dup.Queue, orig.Queue)
	case dup.StoreUnixNano != orig.StoreUnixNano:
		t.Fatalf("%s: duplicate reported with StoreTime %v, the first has %v", what, dup.StoreTime(), orig.StoreTime())
	}
}

// dedup checks a queue that deduplicates (see Features.Dedup).
func (s *queueSuite) dedup(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	d, ok := q.(ferry.Deduplicator)
	if !ok {
		t.Fatalf("Features.Dedup, but %T does not implement ferry.Deduplicator", q)
	}
	if got := d.DedupWindow(); got != ferry.DefaultDedupWindow {
		t.Fatalf("DedupWindow() = %v for a topic of DedupWindow 0, want %v", got, ferry.DefaultDedupWindow)
	}
	a, plain, c := keyedMessage(0, "a"), newMessage(1), keyedMessage(2, "c")
	first, dup := writeDedup(t, w, q, []*ferry.EnhancedMessage{a, plain, c})
	if first != 0 || fmt.Sprint(dup) != "[false false false]" {
		t.Fatalf("first write of new keys: first %d, duplicates %v; want 0, none", first, dup)
	}
	// Keys stored before, a new key twice, and no key.
	again := []*ferry.EnhancedMessage{keyedMessage(3, "a"), keyedMessage(4, "d"), keyedMessage(5, "c"), keyedMessage(6, "d"), newMessage(7)}
	first, dup = writeDedup(t, w, q, again)
	if first != 3 || fmt.Sprint(dup) != "[true false true true false]" {
		t.Fatalf("write of [a d c d -]: first %d, duplicates %v; want 3, [true false true true false]", first, dup)
	}
	wantDuplicate(t, "a again", again[0], a)
	wantDuplicate(t, "c again", again[2], c)
	wantDuplicate(t, "d twice in a batch", again[3], again[1])
	if again[1].Offset != 3 || again[4].Offset != 4 {
		t.Fatalf("the stored messages of the batch at offsets %d, %d; want 3, 4", again[1].Offset, again[4].Offset)
	}
	wantOffsets(t, q, 0, 5)
	wantMessages(t, readRange(t, w.ctx, q, 0, 5, 8), []*ferry.EnhancedMessage{a, plain, c, again[1], again[4]})

	// A batch of duplicates only stores nothing and returns the next offset.
	all := []*ferry.EnhancedMessage{keyedMessage(8, "a"), keyedMessage(9, "d")}
	first, dup = writeDedup(t, w, q, all)
	if first != 5 || fmt.Sprint(dup) != "[true true]" {
		t.Fatalf("write of duplicates only: first %d, duplicates %v; want 5, both", first, dup)
	}
	wantOffsets(t, q, 0, 5)

	if tw, ok := q.(ferry.TryWriter); ok {
		m := keyedMessage(10, "c")
		first, err := tw.TryWrite([]*ferry.EnhancedMessage{m})
		must(t, err, "TryWrite")
		if first != 5 || m.Offset == first {
			t.Fatalf("TryWrite of a duplicate stored it at %d (first %d)", m.Offset, first)
		}
		wantDuplicate(t, "TryWrite", m, c)
	}
	if aw, ok := q.(ferry.AsyncWriter); ok {
		ms := [][]*ferry.EnhancedMessage{{keyedMessage(11, "e")}, {keyedMessage(12, "e"), keyedMessage(13, "a")}}
		type outcome struct {
			first int64
			err   error
		}
		got := make(chan outcome, len(ms))
		for _, b := range ms {
			aw.WriteAsync(w.ctx, b, func(first int64, err error) { got <- outcome{first, err} })
		}
		o1, o2 := <-got, <-got
		must(t, o1.err, "WriteAsync")
		must(t, o2.err, "WriteAsync")
		if d := duplicates(o1.first, ms[0]); d[0] {
			t.Fatalf("WriteAsync of a new key reported a duplicate")
		}
		if d := duplicates(o2.first, ms[1]); !d[0] || !d[1] {
			t.Fatalf("WriteAsync of keys stored before: duplicates %v, want both", d)
		}
		wantDuplicate(t, "WriteAsync", ms[1][0], ms[0][0])
		wantDuplicate(t, "WriteAsync", ms[1][1], a)
	}
}

// dedupConcurrent: writers racing with the same keys store each once,
// and each write's report tells which of its messages were stored.
func (s *queueSuite) dedupConcurrent(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	const writers, keys = 6, 60
	var mu sync.Mutex
	stored := map[string][]int64{}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for k := 0; k < keys; k += 3 {
				b := []*ferry.EnhancedMessage{keyedMessage(g, fmt.Sprint("k", k)), keyedMessage(g, fmt.Sprint("k", k+1)), keyedMessage(g, fmt.Sprint("k", k+2))}
				first, err := q.Write(w.ctx, b)
				if err != nil {
					errs <- err
					return
				}
				dup := duplicates(first, b)
				mu.Lock()
				for i, m := range b {
					if !dup[i] {
						stored[m.DedupKey] = append(stored[m.DedupKey], m.Offset)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err, "concurrent Write")
	}
	wantOffsets(t, q, 0, keys)
	for _, m := range readRange(t, w.ctx, q, 0, keys, 16) {
		if offs := stored[m.DedupKey]; len(offs) != 1 || offs[0] != m.Offset {
			t.Fatalf("key %s: reported stored at %v, read at %d", m.DedupKey, offs, m.Offset)
		}
	}
	if len(stored) != keys {
		t.Fatalf("%d keys reported stored, want %d", len(stored), keys)
	}
}

// dedupWindow: a key stored a window ago (by store time) is new again;
// DedupOff stores every message.
func (s *queueSuite) dedupWindow(t *testing.T, w *watchdog) {
	const window = 50 * time.Millisecond
	q := s.openWindow(t, w, window)
	if got := q.(ferry.Deduplicator).DedupWindow(); got != window {
		t.Fatalf("DedupWindow() = %v, want the topic's %v", got, window)
	}
	a := keyedMessage(0, "a")
	write(t, w, q, []*ferry.EnhancedMessage{a})
	// Written again until stored: never before the window has passed.
	const never = "a key a window old is never stored again"
	for {
		m := keyedMessage(1, "a")
		first, err := q.Write(w.ctx, []*ferry.EnhancedMessage{m})
		if err != nil && w.ctx.Err() != nil {
			t.Fatalf("%s (the watchdog ended the wait: %v)", never, err)
		}
		must(t, err, "Write")
		if dup := duplicates(first, []*ferry.EnhancedMessage{m}); !dup[0] {
			if m.StoreUnixNano-a.StoreUnixNano < int64(window) {
				t.Fatalf("key stored again %v after the first, within the window of %v", m.StoreTime().Sub(a.StoreTime()), window)
			}
			if first != 1 {
				t.Fatalf("stored again at %d, want 1", first)
			}
			break
		}
		wantDuplicate(t, "within the window", m, a)
		select {
		case <-w.ctx.Done():
			t.Fatal(never)
		case <-time.After(window / 5):
		}
	}

	off := s.openWindow(t, w, ferry.DedupOff)
	if got := off.(ferry.Deduplicator).DedupWindow(); got != 0 {
		t.Fatalf("DedupWindow() = %v for DedupOff, want 0", got)
	}
	first, dup := writeDedup(t, w, off, []*ferry.EnhancedMessage{keyedMessage(0, "a"), keyedMessage(1, "a")})
	if first != 0 || dup[0] || dup[1] {
		t.Fatalf("DedupOff: first %d, duplicates %v; want every message stored", first, dup)
	}
}

// dedupReopen (TestStorage, with Features.Dedup and Persistent): keys
// stored before a Close are duplicates after the reopen, reported where
// they were first stored, and the window is saved with the topic.
func (s *storageSuite) dedupReopen(t *testing.T, w *watchdog) {
	dir := t.TempDir()
	st := s.openAt(t, w, dir)
	meta := ferry.TopicMeta{Name: "dedup", Queues: 1, DedupWindow: time.Hour}
	must(t, st.SaveTopic(w.ctx, meta), "SaveTopic")
	q := openQueue(t, w, st, meta, 0)
	first := []*ferry.EnhancedMessage{keyedMessage(0, "a"), keyedMessage(1, "b")}
	for _, m := range first {
		m.Topic = meta.Name
	}
	write(t, w, q, first)
	must(t, q.Close(), "Close queue")
	must(t, st.Close(), "Close storage")

	st = s.openAt(t, w, dir)
	wantTopics(t, w, st, meta)
	q = openQueue(t, w, st, meta, 0)
	if got := q.(ferry.Deduplicator).DedupWindow(); got != time.Hour {
		t.Fatalf("DedupWindow() = %v after reopen, want %v", got, time.Hour)
	}
	again := []*ferry.EnhancedMessage{keyedMessage(2, "b"), keyedMessage(3, "a"), keyedMessage(4, "c")}
	for _, m := range again {
		m.Topic = meta.Name
	}
	off, dup := writeDedup(t, w, q, again)
	if off != 2 || fmt.Sprint(dup) != "[true true false]" {
		t.Fatalf("after reopen, write of [b a c]: first %d, duplicates %v; want 2, [true true false]", off, dup)
	}
	wantDuplicate(t, "b after reopen", again[0], first[1])
	wantDuplicate(t, "a after reopen", again[1], first[0])
	wantOffsets(t, q, 0, 3)
}
