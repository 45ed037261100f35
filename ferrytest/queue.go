package ferrytest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// QueueFactory returns a new, empty queue number queue (in [0,
// meta.Queues)) of the topic meta describes, bounded by meta.Retention. It
// reports its own failures through t and may register clean-up (of a
// storage it opened, say) with t.Cleanup; the suite closes the queue.
type QueueFactory func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue

// TestQueue checks that the queues newQueue returns keep the contract of
// [ferry.Queue]. Each subtest gets a fresh queue (number 1 of a topic of 3
// queues) and checks:
//
//   - Identity: ID names the topic and queue; a new queue is empty (Offsets
//     0, 0).
//   - WriteRead: batches get contiguous offsets from 0 in order; Write
//     returns the first, stamps Queue, Offset and StoreUnixNano on each message;
//     Read returns them, every field equal, from any offset, as many as dst
//     holds.
//   - EmptyWrite: an empty batch writes nothing and returns the next offset.
//   - InvalidBatch: a batch holding a nil message is [ferry.ErrInvalidMessage]
//     and stores none of the batch.
//   - TooLarge: a batch of more messages or bytes than the retention holds
//     is [ferry.ErrMessageTooLarge] and stores nothing; one that fits is
//     written.
//   - ReadEmptyDst: a Read with an empty dst returns 0 at once, even on an
//     empty queue.
//   - OutOfRange: Read below 0, beyond the next offset or below the oldest
//     retained offset is [ferry.ErrOffsetOutOfRange].
//   - ReadBlocks: Reads at the next offset block until a write, then every
//     blocked reader gets it.
//   - ReadContext: a Read waiting for data returns the context's error when
//     it is cancelled or its deadline passes, and the queue works on: a
//     reader blocked beside a cancelled one still gets the next write.
//   - Retention: bounds by messages, by bytes, unlimited and (with
//     [Features].RetentionExact) by age; exact or at least bounded as
//     [Features].RetentionExact says.
//   - Block (with [Features].Block): TryWrite refuses a full queue with
//     [ferry.ErrQueueFull]; Write waits until Release makes room, or its
//     context ends, or the queue is closed.
//   - Concurrent: concurrent writers and readers; every batch lands
//     contiguous at the offset Write returned, nothing is lost or
//     duplicated, every reader sees the same log, Offsets never move back.
//   - ConcurrentRetention: readers racing writers on a queue that keeps
//     dropping its oldest messages (one of them reading offset 0 over and
//     over) get messages in offset order or [ferry.ErrOffsetOutOfRange],
//     never anything else, and catch up.
//   - Close: Close twice returns nil; afterwards Write and Read return
//     [ferry.ErrClosed] (as do TryWrite and Read at the next offset);
//     ID still answers.
//   - CloseWakesReader: a Read blocked on an empty queue returns
//     [ferry.ErrClosed] when the queue is closed.
//   - NilContext: Write and Read (of a stored message, and at the next
//     offset) with a nil context are [ferry.ErrInvalidOption], never a
//     panic, and change nothing (and OffsetsContext, for a queue with
//     it).
//
// With [Features].Dedup:
//
//   - Dedup: the queue is a [ferry.Deduplicator] of the topic's window; a
//     message whose DedupKey was stored before, or is earlier in the
//     batch, is not stored and gets the first one's Queue, Offset, ID and
//     StoreUnixNano; the others take contiguous offsets from the first
//     Write returns ([ferry.Duplicates]); a batch of duplicates stores
//     nothing; TryWrite and WriteAsync too, for a queue with them.
//   - DedupConcurrent: writers racing with the same keys store each once.
//   - DedupWindow: a key a window old (by store time) is stored again,
//     never sooner; [ferry.DedupOff] stores every message.
//
// For a queue that implements [ferry.OffsetsContexter] (skipped
// otherwise):
//
//   - OffsetsContext: it agrees with Offsets; a cancelled ctx is its
//     error; after Close it is [ferry.ErrClosed].
//
// For a queue that implements [ferry.AsyncWriter] (skipped otherwise):
//
//   - WriteAsync: writes begun one after another are stored in that
//     order and reported once each, in that order, with their first
//     offset and the messages stamped; a batch with a nil message
//     ([ferry.ErrInvalidMessage]) and a nil ctx
//     ([ferry.ErrInvalidOption]) are refused through done, in order with
//     the others; Close with writes in flight reports each before it
//     returns; afterwards WriteAsync reports [ferry.ErrClosed].
func TestQueue(t *testing.T, f Features, newQueue QueueFactory) {
	t.Helper()
	qs := &queueSuite{f: f, newQueue: newQueue}
	run(t, f, "Identity", qs.identity)
	run(t, f, "WriteRead", qs.writeRead)
	run(t, f, "EmptyWrite", qs.emptyWrite)
	run(t, f, "InvalidBatch", qs.invalidBatch)
	run(t, f, "TooLarge", qs.tooLarge)
	run(t, f, "ReadEmptyDst", qs.readEmptyDst)
	run(t, f, "OutOfRange", qs.outOfRange)
	run(t, f, "ReadBlocks", qs.readBlocks)
	run(t, f, "ReadContext", qs.readContext)
	run(t, f, "Retention", qs.retention)
	if f.Block {
		run(t, f, "Block", qs.block)
	}
	run(t, f, "Concurrent", qs.concurrent)
	run(t, f, "ConcurrentRetention", qs.concurrentRetention)
	run(t, f, "Close", qs.close)
	run(t, f, "CloseWakesReader", qs.closeWakesReader)
	run(t, f, "NilContext", qs.nilContext)
	run(t, f, "OffsetsContext", qs.offsetsContext)
	run(t, f, "WriteAsync", qs.writeAsync)
	if f.Dedup {
		run(t, f, "Dedup", qs.dedup)
		run(t, f, "DedupConcurrent", qs.dedupConcurrent)
		run(t, f, "DedupWindow", qs.dedupWindow)
	}
}

type queueSuite struct {
	f        Features
	newQueue QueueFactory
}

const (
	suiteTopic = "ferrytest.queue"
	suiteQueue = 1
)

func suiteMeta(r ferry.Retention) ferry.TopicMeta {
	return ferry.TopicMeta{Name: suiteTopic, Queues: 3, Retention: r}
}

// open returns a fresh queue, closed when the subtest ends or hangs.
func (s *queueSuite) open(t *testing.T, w *watchdog, r ferry.Retention) ferry.Queue {
	t.Helper()
	q := s.newQueue(t, suiteMeta(r), suiteQueue)
	if q == nil {
		t.Fatal("ferrytest: the queue factory returned nil")
	}
	w.closeOnHang(q)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// newMessage returns a message with every field the producer stamps set,
// marked with seq.
func newMessage(seq int) *ferry.EnhancedMessage {
	now := time.Now()
	s := strconv.Itoa(seq)
	return &ferry.EnhancedMessage{
		Message: ferry.Message{
			Topic:   suiteTopic,
			Key:     "key-" + s,
			Tag:     "tag",
			Headers: map[string]string{"seq": s},
			Body:    []byte("body-" + s),
		},
		ID:           ferry.NewMessageID(now),
		BornUnixNano: now.UnixNano(),
		Origin:       &ferry.Origin{Producer: "ferrytest", Host: "ferrytest"},
	}
}

// newMessages returns n messages marked from seq on.
func newMessages(seq, n int) []*ferry.EnhancedMessage {
	out := make([]*ferry.EnhancedMessage, n)
	for i := range out {
		out[i] = newMessage(seq + i)
	}
	return out
}

// sizedMessage returns a message whose Size is size bytes, all body.
func sizedMessage(size int) *ferry.EnhancedMessage {
	now := time.Now()
	return &ferry.EnhancedMessage{
		Message:      ferry.Message{Topic: suiteTopic, Body: make([]byte, size)},
		ID:           ferry.NewMessageID(now),
		BornUnixNano: now.UnixNano(),
	}
}

func write(t *testing.T, w *watchdog, q ferry.Queue, msgs []*ferry.EnhancedMessage) int64 {
	t.Helper()
	first, err := q.Write(w.ctx, msgs)
	must(t, err, fmt.Sprintf("Write of %d messages", len(msgs)))
	return first
}

func wantOffsets(t *testing.T, q ferry.Queue, oldest, next int64) {
	t.Helper()
	if o, n := q.Offsets(); o != oldest || n != next {
		t.Fatalf("Offsets() = %d, %d; want %d, %d", o, n, oldest, next)
	}
}

// readRange reads [from, to) with reads of at most batch messages.
func readRange(t *testing.T, ctx context.Context, q ferry.Queue, from, to int64, batch int) []*ferry.EnhancedMessage {
	t.Helper()
	out := make([]*ferry.EnhancedMessage, 0, to-from)
	dst := make([]*ferry.EnhancedMessage, batch)
	for off := from; off < to; {
		n, err := q.Read(ctx, off, dst)
		must(t, err, fmt.Sprintf("Read at %d", off))
		if n <= 0 || n > len(dst) {
			t.Fatalf("Read at %d into %d slots returned %d", off, len(dst), n)
		}
		for _, m := range dst[:n] {
			if m == nil || m.Offset != off {
				t.Fatalf("Read from %d: message at position %d has offset %v", from, off-from, offsetOf(m))
			}
			out = append(out, m)
			off++
		}
	}
	return out
}

func offsetOf(m *ferry.EnhancedMessage) any {
	if m == nil {
		return "nil"
	}
	return m.Offset
}

func wantMessages(t *testing.T, got, want []*ferry.EnhancedMessage) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d messages, want %d", len(got), len(want))
	}
	for i := range got {
		if d := sameMessage(got[i], want[i]); d != "" {
			t.Fatalf("message %d (offset %d): %s", i, want[i].Offset, d)
		}
	}
}

func (s *queueSuite) identity(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	if got, want := q.ID(), (ferry.QueueID{Topic: suiteTopic, Queue: suiteQueue}); got != want {
		t.Fatalf("ID() = %v, want %v", got, want)
	}
	wantOffsets(t, q, 0, 0)
}

func (s *queueSuite) writeRead(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	var all []*ferry.EnhancedMessage
	next := int64(0)
	before := time.Now()
	for i, n := range []int{1, 3, 5} {
		batch := newMessages(len(all), n)
		first := write(t, w, q, batch)
		if first != next {
			t.Fatalf("batch %d: Write returned first offset %d, want %d", i, first, next)
		}
		for j, m := range batch {
			if m.Queue != suiteQueue || m.Offset != first+int64(j) {
				t.Fatalf("batch %d message %d stamped queue %d offset %d, want queue %d offset %d", i, j, m.Queue, m.Offset, suiteQueue, first+int64(j))
			}
			if m.StoreTime().IsZero() || m.StoreTime().Before(before.Add(-time.Second)) {
				t.Fatalf("batch %d message %d stamped StoreTime %v, want about now", i, j, m.StoreTime())
			}
		}
		all = append(all, batch...)
		next += int64(n)
		wantOffsets(t, q, 0, next)
	}
	wantMessages(t, readRange(t, w.ctx, q, 0, next, 100), all)
	wantMessages(t, readRange(t, w.ctx, q, 0, next, 1), all)
	wantMessages(t, readRange(t, w.ctx, q, 4, next, 2), all[4:])

	dst := make([]*ferry.EnhancedMessage, 2)
	n, err := q.Read(w.ctx, 4, dst)
	must(t, err, "Read at 4 into 2 slots")
	if n != 2 {
		t.Fatalf("Read at 4 into 2 slots with 5 messages there returned %d, want 2", n)
	}
	dst = make([]*ferry.EnhancedMessage, 10)
	n, err = q.Read(w.ctx, next-1, dst)
	must(t, err, "Read of the last message")
	if n != 1 {
		t.Fatalf("Read of the last message into 10 slots returned %d, want 1", n)
	}
	wantMessages(t, dst[:1], all[next-1:])
}

func (s *queueSuite) emptyWrite(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	for _, batch := range [][]*ferry.EnhancedMessage{nil, {}} {
		if first := write(t, w, q, batch); first != 0 {
			t.Fatalf("empty Write on an empty queue returned %d, want 0", first)
		}
	}
	wantOffsets(t, q, 0, 0)
	write(t, w, q, newMessages(0, 2))
	if first := write(t, w, q, nil); first != 2 {
		t.Fatalf("empty Write after 2 messages returned %d, want 2", first)
	}
	wantOffsets(t, q, 0, 2)
	if first := write(t, w, q, newMessages(2, 1)); first != 2 {
		t.Fatalf("Write after an empty Write returned %d, want 2", first)
	}
}

func (s *queueSuite) invalidBatch(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	write(t, w, q, newMessages(0, 1))
	_, err := q.Write(w.ctx, []*ferry.EnhancedMessage{newMessage(1), nil, newMessage(2)})
	wantErr(t, err, ferry.ErrInvalidMessage, "Write of a batch holding nil")
	_, err = q.Write(w.ctx, []*ferry.EnhancedMessage{nil})
	wantErr(t, err, ferry.ErrInvalidMessage, "Write of [nil]")
	wantOffsets(t, q, 0, 1)
	m := newMessage(3)
	if first := write(t, w, q, []*ferry.EnhancedMessage{m}); first != 1 {
		t.Fatalf("Write after a refused batch returned %d, want 1", first)
	}
	wantMessages(t, readRange(t, w.ctx, q, 1, 2, 4), []*ferry.EnhancedMessage{m})
}

func (s *queueSuite) tooLarge(t *testing.T, w *watchdog) {
	t.Run("Messages", func(t *testing.T) {
		q := s.open(t, w, ferry.Retention{MaxMessages: 4})
		_, err := q.Write(w.ctx, newMessages(0, 5))
		wantErr(t, err, ferry.ErrMessageTooLarge, "Write of 5 messages, retention 4")
		wantOffsets(t, q, 0, 0)
		if first := write(t, w, q, newMessages(0, 4)); first != 0 {
			t.Fatalf("Write of 4 messages, retention 4, returned %d, want 0", first)
		}
		wantOffsets(t, q, 0, 4)
	})
	t.Run("Bytes", func(t *testing.T) {
		q := s.open(t, w, ferry.Retention{MaxBytes: 100})
		_, err := q.Write(w.ctx, []*ferry.EnhancedMessage{sizedMessage(100), sizedMessage(100)})
		wantErr(t, err, ferry.ErrMessageTooLarge, "Write of 200 bytes, retention 100")
		_, err = q.Write(w.ctx, []*ferry.EnhancedMessage{sizedMessage(101)})
		wantErr(t, err, ferry.ErrMessageTooLarge, "Write of one 101-byte message, retention 100")
		wantOffsets(t, q, 0, 0)
		write(t, w, q, []*ferry.EnhancedMessage{sizedMessage(25), sizedMessage(25)})
		wantOffsets(t, q, 0, 2)
		if s.f.RetentionExact {
			_, err = q.Write(w.ctx, []*ferry.EnhancedMessage{sizedMessage(50), sizedMessage(51)})
			wantErr(t, err, ferry.ErrMessageTooLarge, "Write of 101 bytes, retention 100")
			wantOffsets(t, q, 0, 2)
			write(t, w, q, []*ferry.EnhancedMessage{sizedMessage(50), sizedMessage(50)})
			wantOffsets(t, q, 2, 4)
		}
	})
}

func (s *queueSuite) readEmptyDst(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	for _, dst := range [][]*ferry.EnhancedMessage{nil, {}} {
		n, err := q.Read(w.ctx, 0, dst)
		if n != 0 || err != nil {
			t.Fatalf("Read into an empty dst on an empty queue = %d, %v; want 0, nil", n, err)
		}
	}
	write(t, w, q, newMessages(0, 2))
	n, err := q.Read(w.ctx, 0, nil)
	if n != 0 || err != nil {
		t.Fatalf("Read into an empty dst = %d, %v; want 0, nil", n, err)
	}
}

func (s *queueSuite) outOfRange(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{MaxMessages: 2})
	dst := make([]*ferry.EnhancedMessage, 4)
	for _, off := range []int64{-1, 1, 100} {
		_, err := q.Read(w.ctx, off, dst)
		wantErr(t, err, ferry.ErrOffsetOutOfRange, fmt.Sprintf("Read at %d of an empty queue", off))
	}
	write(t, w, q, newMessages(0, 2))
	write(t, w, q, newMessages(2, 1))
	oldest, next := q.Offsets()
	if next != 3 || oldest < 0 || oldest > 1 {
		t.Fatalf("Offsets() after 3 messages with retention 2 = %d, %d; want oldest in [0, 1], next 3", oldest, next)
	}
	for _, off := range []int64{-1, next + 1, next + 100} {
		_, err := q.Read(w.ctx, off, dst)
		wantErr(t, err, ferry.ErrOffsetOutOfRange, fmt.Sprintf("Read at %d with offsets [%d, %d)", off, oldest, next))
	}
	if oldest > 0 {
		_, err := q.Read(w.ctx, oldest-1, dst)
		wantErr(t, err, ferry.ErrOffsetOutOfRange, fmt.Sprintf("Read at %d below the oldest %d", oldest-1, oldest))
	}
	if s.f.RetentionExact {
		wantOffsets(t, q, 1, 3)
		_, err := q.Read(w.ctx, 0, dst)
		wantErr(t, err, ferry.ErrOffsetOutOfRange, "Read at a dropped offset")
	}
}

// startRead runs Read in a goroutine and returns where its result arrives.
func startRead(ctx context.Context, q ferry.Queue, off int64, dst []*ferry.EnhancedMessage) <-chan result {
	ch := make(chan result, 1)
	go func() {
		n, err := q.Read(ctx, off, dst)
		ch <- result{int64(n), err}
	}()
	return ch
}

func wantPending(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned (%d, %v) before it could", what, r.n, r.err)
	default:
	}
}

func (s *queueSuite) readBlocks(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	const readers = 3
	dsts := make([][]*ferry.EnhancedMessage, readers)
	chs := make([]<-chan result, readers)
	for i := range chs {
		dsts[i] = make([]*ferry.EnhancedMessage, 4)
		chs[i] = startRead(w.ctx, q, 0, dsts[i])
	}
	for i := range chs {
		wantPending(t, chs[i], fmt.Sprintf("Read %d on an empty queue", i))
	}
	batch := newMessages(0, 2)
	write(t, w, q, batch)
	for i, ch := range chs {
		r := <-ch
		must(t, r.err, fmt.Sprintf("blocked Read %d", i))
		if r.n < 1 || r.n > 2 {
			t.Fatalf("blocked Read %d returned %d messages after a write of 2", i, r.n)
		}
		wantMessages(t, dsts[i][:r.n], batch[:r.n])
	}

	dst := make([]*ferry.EnhancedMessage, 4)
	ch := startRead(w.ctx, q, 2, dst)
	wantPending(t, ch, "Read at the next offset")
	m := newMessage(2)
	write(t, w, q, []*ferry.EnhancedMessage{m})
	r := <-ch
	must(t, r.err, "Read blocked at offset 2")
	if r.n != 1 {
		t.Fatalf("Read blocked at offset 2 returned %d messages after a write of 1", r.n)
	}
	wantMessages(t, dst[:1], []*ferry.EnhancedMessage{m})
}

func (s *queueSuite) readContext(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	dst := make([]*ferry.EnhancedMessage, 4)

	ctx, cancel := context.WithCancel(w.ctx)
	cancel()
	_, err := q.Read(ctx, 0, dst)
	wantErr(t, err, context.Canceled, "Read with a cancelled context on an empty queue")

	ctx, cancel = context.WithCancel(w.ctx)
	ch := startRead(ctx, q, 0, dst)
	wantPending(t, ch, "Read on an empty queue")
	cancel()
	wantErr(t, (<-ch).err, context.Canceled, "Read blocked when its context is cancelled")

	ctx, cancel = context.WithTimeout(w.ctx, time.Millisecond)
	defer cancel()
	_, err = q.Read(ctx, 0, dst)
	wantErr(t, err, context.DeadlineExceeded, "Read blocked past its deadline")

	// The abandoned reads must not disturb the next ones: of two blocked
	// readers, the one whose context ends leaves, the other gets the write.
	ctx, cancel = context.WithCancel(w.ctx)
	gone := startRead(ctx, q, 0, make([]*ferry.EnhancedMessage, 1))
	ch = startRead(w.ctx, q, 0, dst)
	wantPending(t, ch, "Read on an empty queue")
	cancel()
	wantErr(t, (<-gone).err, context.Canceled, "Read blocked when its context is cancelled")
	m := newMessage(0)
	write(t, w, q, []*ferry.EnhancedMessage{m})
	r := <-ch
	must(t, r.err, "Read blocked beside a cancelled one")
	wantMessages(t, dst[:r.n], []*ferry.EnhancedMessage{m})
}

func (s *queueSuite) close(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	write(t, w, q, newMessages(0, 3))
	must(t, q.Close(), "Close")
	must(t, q.Close(), "second Close")
	_, err := q.Write(w.ctx, newMessages(3, 1))
	wantErr(t, err, ferry.ErrClosed, "Write after Close")
	_, err = q.Write(w.ctx, nil)
	wantErr(t, err, ferry.ErrClosed, "empty Write after Close")
	dst := make([]*ferry.EnhancedMessage, 4)
	for _, off := range []int64{0, 3} {
		_, err = q.Read(w.ctx, off, dst)
		wantErr(t, err, ferry.ErrClosed, fmt.Sprintf("Read at %d after Close", off))
	}
	if tw, ok := q.(ferry.TryWriter); ok {
		_, err = tw.TryWrite(newMessages(3, 1))
		wantErr(t, err, ferry.ErrClosed, "TryWrite after Close")
	}
	if got, want := q.ID(), (ferry.QueueID{Topic: suiteTopic, Queue: suiteQueue}); got != want {
		t.Fatalf("ID() after Close = %v, want %v", got, want)
	}
	q.Offsets() // must answer, whatever it last knew
}

func (s *queueSuite) closeWakesReader(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	chs := []<-chan result{
		startRead(w.ctx, q, 0, make([]*ferry.EnhancedMessage, 1)),
		startRead(w.ctx, q, 0, make([]*ferry.EnhancedMessage, 1)),
	}
	for _, ch := range chs {
		wantPending(t, ch, "Read on an empty queue")
	}
	must(t, q.Close(), "Close")
	for i, ch := range chs {
		wantErr(t, (<-ch).err, ferry.ErrClosed, fmt.Sprintf("Read %d blocked when the queue is closed", i))
	}
}

func (s *queueSuite) offsetsContext(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	oc, ok := q.(ferry.OffsetsContexter)
	if !ok {
		t.Skip("the queue does not implement ferry.OffsetsContexter")
	}
	write(t, w, q, newMessages(0, 3))
	oldest, next, err := oc.OffsetsContext(w.ctx)
	must(t, err, "OffsetsContext")
	if o, n := q.Offsets(); oldest != o || next != n || next != 3 {
		t.Fatalf("OffsetsContext() = %d, %d; Offsets() = %d, %d; want next 3", oldest, next, o, n)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	cancel()
	_, _, err = oc.OffsetsContext(ctx)
	wantErr(t, err, context.Canceled, "OffsetsContext with a cancelled ctx")
	must(t, q.Close(), "Close")
	_, _, err = oc.OffsetsContext(w.ctx)
	wantErr(t, err, ferry.ErrClosed, "OffsetsContext after Close")
}
