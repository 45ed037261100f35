package ferrytest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// StorageOpener opens the storage kept in dir, a directory the suite made
// for the subtest (t.TempDir). The suite may open the same dir again after
// closing the storage it got: a [Features].Persistent storage must then
// bring back what was saved; any other may ignore dir. It reports its own
// failures through t; the suite closes the storage.
type StorageOpener func(t *testing.T, dir string) ferry.Storage

// TestStorage checks that the storages open returns keep the contract of
// [ferry.Storage]. Each subtest gets a fresh directory and checks:
//
//   - Empty: a new storage has no topics.
//   - Topics: SaveTopic round-trips metadata; Topics returns it sorted by
//     name (compared after [ferry.TopicMeta.Normalized]); saving a name
//     again replaces its metadata.
//   - Invalid: invalid metadata in SaveTopic or OpenQueue, or a queue index
//     outside [0, meta.Queues), is [ferry.ErrInvalidTopic] and changes
//     nothing.
//   - OpenQueue: queues open empty with the right ID, each its own log.
//   - SharedPrefixes: topics whose names share a long prefix (up to the
//     longest name allowed) keep their own metadata and logs, through a
//     reopen when [Features].Persistent.
//   - WideQueues: queues whose indexes agree in their low byte (44, 300,
//     556) keep their own logs, through a reopen when
//     [Features].Persistent.
//   - Reopen: after Close, opening the same dir works; with
//     [Features].Persistent the topics, every queue's messages and offsets
//     come back, and writing goes on at the next offset.
//   - Concurrent: concurrent SaveTopic and OpenQueue calls all take effect.
//   - Close: Close twice returns nil; afterwards SaveTopic, Topics and
//     OpenQueue return [ferry.ErrClosed].
//   - NilContext: SaveTopic, Topics and OpenQueue (and CreateTopic, Topic
//     and DeleteTopic, for a storage with [ferry.SharedStorage] or
//     [ferry.TopicDeleter]) with a nil context are
//     [ferry.ErrInvalidOption], never a panic, and change nothing.
//   - DedupReopen (with [Features].Dedup and Persistent): keys stored
//     before a Close are duplicates after the reopen, reported where they
//     were first stored; the topic's DedupWindow is saved.
//
// Run [TestQueue] over queues the storage opens to check the queues
// themselves.
func TestStorage(t *testing.T, f Features, open StorageOpener) {
	t.Helper()
	ss := &storageSuite{f: f, open: open}
	run(t, f, "Empty", ss.empty)
	run(t, f, "Topics", ss.topics)
	run(t, f, "Invalid", ss.invalid)
	run(t, f, "OpenQueue", ss.openQueue)
	run(t, f, "SharedPrefixes", ss.sharedPrefixes)
	run(t, f, "WideQueues", ss.wideQueues)
	run(t, f, "Reopen", ss.reopen)
	run(t, f, "Concurrent", ss.concurrent)
	run(t, f, "Close", ss.close)
	run(t, f, "NilContext", ss.nilContext)
	if f.Dedup && f.Persistent {
		run(t, f, "DedupReopen", ss.dedupReopen)
	}
}

type storageSuite struct {
	f    Features
	open StorageOpener
}

// openAt opens the storage in dir, closed when the subtest ends or hangs.
func (s *storageSuite) openAt(t *testing.T, w *watchdog, dir string) ferry.Storage {
	t.Helper()
	st := s.open(t, dir)
	if st == nil {
		t.Fatal("ferrytest: the storage opener returned nil")
	}
	w.closeOnHang(st)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func wantTopics(t *testing.T, w *watchdog, st ferry.Storage, want ...ferry.TopicMeta) {
	t.Helper()
	got, err := st.Topics(w.ctx)
	must(t, err, "Topics")
	if len(got) != len(want) {
		t.Fatalf("Topics() = %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i].Normalized() != want[i].Normalized() {
			t.Fatalf("Topics()[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func (s *storageSuite) empty(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	wantTopics(t, w, st)
}

var (
	metaA = ferry.TopicMeta{Name: "alpha", Queues: 2}
	metaB = ferry.TopicMeta{Name: "beta.events", Queues: 1, Retention: ferry.Retention{MaxMessages: 10, MaxBytes: ferry.Unlimited}}
	metaC = ferry.TopicMeta{Name: "%DLQ%group-1", Queues: 4, Retention: ferry.Retention{MaxAge: time.Hour}}
)

func (s *storageSuite) topics(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	metaC := metaC
	if s.f.Block {
		metaC.Retention.Overflow = ferry.Block
	}
	metaB := metaB
	metaB.Incarnation = 1<<63 + 7 // kept as it is, like the rest
	for _, m := range []ferry.TopicMeta{metaB, metaC, metaA} {
		must(t, st.SaveTopic(w.ctx, m), "SaveTopic "+m.Name)
	}
	wantTopics(t, w, st, metaC, metaA, metaB)
	if ss, ok := st.(ferry.SharedStorage); ok {
		// Matching metadata of another incarnation: the topic there
		// stays, with its own.
		again := metaB
		again.Incarnation = 99
		must(t, ss.CreateTopic(w.ctx, again), "CreateTopic of a topic there, another incarnation")
		got, err := ss.Topic(w.ctx, metaB.Name)
		must(t, err, "Topic")
		if got.Incarnation != metaB.Incarnation {
			t.Fatalf("Topic(%q).Incarnation = %d after CreateTopic of another incarnation, want %d (the first)", metaB.Name, got.Incarnation, metaB.Incarnation)
		}
	}
	changed := metaA
	changed.Queues = 3
	changed.Retention.MaxMessages = 7
	must(t, st.SaveTopic(w.ctx, changed), "SaveTopic with new metadata")
	wantTopics(t, w, st, metaC, changed, metaB)
	must(t, st.SaveTopic(w.ctx, changed), "SaveTopic with the same metadata")
	wantTopics(t, w, st, metaC, changed, metaB)
}

func (s *storageSuite) invalid(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	must(t, st.SaveTopic(w.ctx, metaA), "SaveTopic")
	bad := []ferry.TopicMeta{
		{Name: "", Queues: 1},
		{Name: "..", Queues: 1},
		{Name: "a/b", Queues: 1},
		{Name: "ok", Queues: 0},
		{Name: "ok", Queues: -1},
		{Name: "ok", Queues: 1, Retention: ferry.Retention{MaxMessages: -2}},
		{Name: "ok", Queues: 1, Retention: ferry.Retention{Overflow: 9}},
	}
	for _, m := range bad {
		wantErr(t, st.SaveTopic(w.ctx, m), ferry.ErrInvalidTopic, fmt.Sprintf("SaveTopic(%+v)", m))
		_, err := st.OpenQueue(w.ctx, m, 0)
		wantErr(t, err, ferry.ErrInvalidTopic, fmt.Sprintf("OpenQueue(%+v, 0)", m))
	}
	for _, i := range []int{-1, metaA.Queues, metaA.Queues + 10} {
		_, err := st.OpenQueue(w.ctx, metaA, i)
		wantErr(t, err, ferry.ErrInvalidTopic, fmt.Sprintf("OpenQueue(%s, %d)", metaA.Name, i))
	}
	wantTopics(t, w, st, metaA)
}

// openQueue opens queue i of meta, closed when the subtest ends or hangs.
func openQueue(t *testing.T, w *watchdog, st ferry.Storage, meta ferry.TopicMeta, i int) ferry.Queue {
	t.Helper()
	q, err := st.OpenQueue(w.ctx, meta, i)
	must(t, err, fmt.Sprintf("OpenQueue(%s, %d)", meta.Name, i))
	if q == nil {
		t.Fatalf("OpenQueue(%s, %d) returned a nil queue", meta.Name, i)
	}
	w.closeOnHang(q)
	t.Cleanup(func() { _ = q.Close() })
	if got, want := q.ID(), (ferry.QueueID{Topic: meta.Name, Queue: i}); got != want {
		t.Fatalf("OpenQueue(%s, %d) returned queue %v", meta.Name, i, got)
	}
	return q
}

// topicMessages returns n messages for topic marked from seq on.
func topicMessages(topic string, seq, n int) []*ferry.EnhancedMessage {
	msgs := newMessages(seq, n)
	for _, m := range msgs {
		m.Topic = topic
	}
	return msgs
}

func (s *storageSuite) openQueue(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	must(t, st.SaveTopic(w.ctx, metaA), "SaveTopic")
	q0 := openQueue(t, w, st, metaA, 0)
	q1 := openQueue(t, w, st, metaA, 1)
	wantOffsets(t, q0, 0, 0)
	wantOffsets(t, q1, 0, 0)
	m0 := topicMessages(metaA.Name, 0, 3)
	m1 := topicMessages(metaA.Name, 10, 1)
	write(t, w, q0, m0)
	write(t, w, q1, m1)
	wantOffsets(t, q0, 0, 3)
	wantOffsets(t, q1, 0, 1)
	wantMessages(t, readRange(t, w.ctx, q0, 0, 3, 8), m0)
	wantMessages(t, readRange(t, w.ctx, q1, 0, 1, 8), m1)
}

// ownLogs writes distinct messages to queue qs[k] of metas[k], for every
// k, then checks each holds its own, again after a reopen of dir when
// the storage is persistent.
func (s *storageSuite) ownLogs(t *testing.T, w *watchdog, metas []ferry.TopicMeta, qs []int) {
	t.Helper()
	dir := t.TempDir()
	st := s.openAt(t, w, dir)
	written := make([][]*ferry.EnhancedMessage, len(metas))
	for k, meta := range metas {
		must(t, st.SaveTopic(w.ctx, meta), "SaveTopic "+meta.Name)
		q := openQueue(t, w, st, meta, qs[k])
		written[k] = topicMessages(meta.Name, 100*k, 1+k%3)
		write(t, w, q, written[k])
	}
	check := func(st ferry.Storage) {
		t.Helper()
		wantTopics(t, w, st, sortedMetas(metas)...)
		for k, meta := range metas {
			q := openQueue(t, w, st, meta, qs[k])
			wantOffsets(t, q, 0, int64(len(written[k])))
			wantMessages(t, readRange(t, w.ctx, q, 0, int64(len(written[k])), 8), written[k])
		}
	}
	check(st)
	if !s.f.Persistent {
		return
	}
	must(t, st.Close(), "Close storage")
	check(s.openAt(t, w, dir))
}

func sortedMetas(metas []ferry.TopicMeta) []ferry.TopicMeta {
	out := slices.Clone(metas)
	slices.SortFunc(out, func(a, b ferry.TopicMeta) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b ferry.TopicMeta) bool { return a.Name == b.Name })
}

func (s *storageSuite) sharedPrefixes(t *testing.T, w *watchdog) {
	topics, _ := longNames()
	metas := make([]ferry.TopicMeta, len(topics))
	for k, name := range topics {
		metas[k] = ferry.TopicMeta{Name: name, Queues: 1 + k}
	}
	s.ownLogs(t, w, metas, make([]int, len(metas)))
}

func (s *storageSuite) wideQueues(t *testing.T, w *watchdog) {
	meta := ferry.TopicMeta{Name: "wide", Queues: 600}
	qs := []int{0, 44, 256, 300, 556, 599}
	metas := make([]ferry.TopicMeta, len(qs))
	for k := range metas {
		metas[k] = meta
	}
	s.ownLogs(t, w, metas, qs)
}

func (s *storageSuite) reopen(t *testing.T, w *watchdog) {
	dir := t.TempDir()
	st := s.openAt(t, w, dir)
	metaA := metaA
	metaA.Incarnation = 12345 // a persistent storage keeps it
	must(t, st.SaveTopic(w.ctx, metaA), "SaveTopic")
	must(t, st.SaveTopic(w.ctx, metaB), "SaveTopic")
	var written [2][]*ferry.EnhancedMessage
	for i := range written {
		q := openQueue(t, w, st, metaA, i)
		written[i] = topicMessages(metaA.Name, i*100, 2+i*3)
		write(t, w, q, written[i][:2])
		write(t, w, q, written[i][2:])
		must(t, q.Close(), "Close queue")
	}
	must(t, st.Close(), "Close storage")

	st = s.openAt(t, w, dir)
	if !s.f.Persistent {
		_, err := st.Topics(w.ctx)
		must(t, err, "Topics after reopen")
		return
	}
	wantTopics(t, w, st, metaA, metaB)
	for i, want := range written {
		q := openQueue(t, w, st, metaA, i)
		wantOffsets(t, q, 0, int64(len(want)))
		wantMessages(t, readRange(t, w.ctx, q, 0, int64(len(want)), 3), want)
		more := topicMessages(metaA.Name, 1000, 2)
		if first := write(t, w, q, more); first != int64(len(want)) {
			t.Fatalf("queue %d: Write after reopen returned %d, want %d", i, first, len(want))
		}
		wantMessages(t, readRange(t, w.ctx, q, 0, int64(len(want)+2), 3), append(want, more...))
	}
	q := openQueue(t, w, st, metaB, 0)
	wantOffsets(t, q, 0, 0)
}

func (s *storageSuite) concurrent(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	const n = 8
	errs := make([]error, n)
	queues := make([]ferry.Queue, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			meta := ferry.TopicMeta{Name: "topic-" + strconv.Itoa(i), Queues: 2}
			if err := st.SaveTopic(w.ctx, meta); err != nil {
				errs[i] = fmt.Errorf("SaveTopic %s: %w", meta.Name, err)
				return
			}
			q, err := st.OpenQueue(w.ctx, meta, i%2)
			if err != nil {
				errs[i] = fmt.Errorf("OpenQueue %s: %w", meta.Name, err)
				return
			}
			queues[i] = q
			_, err = q.Write(w.ctx, topicMessages(meta.Name, i, 1))
			errs[i] = err
		})
	}
	wg.Wait()
	for _, q := range queues {
		if q != nil {
			w.closeOnHang(q)
			t.Cleanup(func() { _ = q.Close() })
		}
	}
	must(t, errors.Join(errs...), "concurrent SaveTopic, OpenQueue and Write")
	want := make([]ferry.TopicMeta, n)
	for i := range want {
		want[i] = ferry.TopicMeta{Name: "topic-" + strconv.Itoa(i), Queues: 2}
	}
	wantTopics(t, w, st, want...)
	for i, q := range queues {
		if got := q.ID(); got != (ferry.QueueID{Topic: want[i].Name, Queue: i % 2}) {
			t.Fatalf("OpenQueue(%s, %d) returned queue %v", want[i].Name, i%2, got)
		}
		wantOffsets(t, q, 0, 1)
	}
}

func (s *storageSuite) close(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	must(t, st.SaveTopic(w.ctx, metaA), "SaveTopic")
	must(t, st.Close(), "Close")
	must(t, st.Close(), "second Close")
	wantErr(t, st.SaveTopic(w.ctx, metaB), ferry.ErrClosed, "SaveTopic after Close")
	_, err := st.Topics(w.ctx)
	wantErr(t, err, ferry.ErrClosed, "Topics after Close")
	_, err = st.OpenQueue(w.ctx, metaA, 0)
	wantErr(t, err, ferry.ErrClosed, "OpenQueue after Close")
}
