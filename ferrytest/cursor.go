package ferrytest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ferrymq/ferry"
)

// CursorStoreOpener opens the cursor store kept in dir, a directory the
// suite made for the subtest (t.TempDir). The suite may open the same dir
// again after closing the store it got: a [Features].Persistent store must
// then bring back what was committed; any other may ignore dir. It reports
// its own failures through t; the suite closes the store.
type CursorStoreOpener func(t *testing.T, dir string) ferry.CursorStore

// TestCursorStore checks that the stores open returns keep the contract of
// [ferry.CursorStore]. Each subtest gets a fresh directory and checks:
//
//   - Unset: Load returns one -1 per queue where nothing was committed,
//     and an empty slice for zero queues.
//   - RoundTrip: Commit then Load returns the offset, kept apart per
//     topic, group and queue; Load of fewer or more queues than committed
//     works.
//   - Replace: a later Commit replaces an earlier one, even with a lower
//     offset.
//   - Invalid: a bad topic name or negative queue count is
//     [ferry.ErrInvalidTopic]; an empty group, a negative queue or offset is
//     an error; none changes anything.
//   - SharedPrefixes: topics and groups whose names share a long prefix
//     (up to the longest name allowed) keep apart.
//   - WideQueues: queue indexes past a byte (256 and up, to
//     [ferry.MaxQueues]-1) keep apart from those below.
//   - CallerOwnsSlice: changing the slice Load returned changes nothing.
//   - Concurrent: concurrent commits to many queues and groups all land;
//     concurrent commits to one queue leave one of the offsets committed.
//   - Reopen: after Close, opening the same dir works; with
//     [Features].Persistent every commit comes back, long names and wide
//     queue indexes included.
//   - Close: Close twice returns nil; afterwards Load and Commit return
//     [ferry.ErrClosed] (and Cursors, Forget and CommitFenced, for a
//     store with them).
//   - NilContext: Load and Commit (and CommitFenced, Cursors and Forget,
//     for a store with them) with a nil context are
//     [ferry.ErrInvalidOption], never a panic, and change nothing.
//
// For a store that implements [ferry.CursorGroups] (skipped otherwise):
//
//   - Groups: Cursors lists exactly the groups with a commit on the topic
//     (not those of other topics), each with one offset per queue, -1
//     where nothing was committed; the caller owns the result; a bad
//     topic or queue count is [ferry.ErrInvalidTopic].
//   - Forget: Load then gives -1 for every queue and Cursors omits the
//     group; other groups and topics keep theirs; forgetting a group
//     without cursors is nil; the group can commit again; with
//     [Features].Persistent the forgetting survives a reopen.
//
// For a store that implements [ferry.FencedCursorStore] (skipped
// otherwise):
//
//   - Fenced: CommitFenced with a token lower than the last fenced
//     commit's is [ferry.ErrFenced] and writes nothing; an equal or
//     higher token writes; a plain Commit still writes (a reset) and
//     does not lower the token; tokens are kept per topic, group and
//     queue; with [Features].TokensPersist they survive a reopen.
//
// For a store that implements [ferry.HandoffCursorStore] (skipped
// otherwise):
//
//   - Handoff: TakeCursor returns the cursor (-1 for a queue never
//     committed) and its finished set, and fences: a commit or take with
//     a lower token is then [ferry.ErrFenced] and writes nothing;
//     CommitFinished commits the cursor with its set, fenced; any other
//     commit of the queue empties the set; sets are per topic, group and
//     queue; a set not above the offset, out of order or over
//     [ferry.MaxFinishedSet] is [ferry.ErrInvalidOption] and writes
//     nothing; Forget forgets it; the caller owns the slice; with
//     [Features].Persistent the set survives a reopen.
func TestCursorStore(t *testing.T, f Features, open CursorStoreOpener) {
	t.Helper()
	cs := &cursorSuite{f: f, open: open}
	run(t, f, "Unset", cs.unset)
	run(t, f, "RoundTrip", cs.roundTrip)
	run(t, f, "Replace", cs.replace)
	run(t, f, "Invalid", cs.invalid)
	run(t, f, "SharedPrefixes", cs.sharedPrefixes)
	run(t, f, "WideQueues", cs.wideQueues)
	run(t, f, "CallerOwnsSlice", cs.callerOwnsSlice)
	run(t, f, "Concurrent", cs.concurrent)
	run(t, f, "Reopen", cs.reopen)
	run(t, f, "Close", cs.close)
	run(t, f, "NilContext", cs.nilContext)
	run(t, f, "Groups", cs.groups)
	run(t, f, "Forget", cs.forget)
	run(t, f, "Fenced", cs.fenced)
	run(t, f, "Handoff", cs.handoff)
}

type cursorSuite struct {
	f    Features
	open CursorStoreOpener
}

func (s *cursorSuite) openAt(t *testing.T, w *watchdog, dir string) ferry.CursorStore {
	t.Helper()
	cs := s.open(t, dir)
	if cs == nil {
		t.Fatal("ferrytest: the cursor store opener returned nil")
	}
	w.closeOnHang(cs)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func wantCursor(t *testing.T, w *watchdog, cs ferry.CursorStore, topic, group string, want ...int64) {
	t.Helper()
	got, err := cs.Load(w.ctx, topic, group, len(want))
	must(t, err, fmt.Sprintf("Load(%s, %s, %d)", topic, group, len(want)))
	if got == nil && len(want) == 0 {
		got = []int64{}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Load(%s, %s, %d) = %v, want %v", topic, group, len(want), got, want)
	}
}

func commit(t *testing.T, w *watchdog, cs ferry.CursorStore, topic, group string, queue int, off int64) {
	t.Helper()
	must(t, cs.Commit(w.ctx, topic, group, queue, off), fmt.Sprintf("Commit(%s, %s, %d, %d)", topic, group, queue, off))
}

func (s *cursorSuite) unset(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	wantCursor(t, w, cs, "orders", "billing", -1, -1, -1)
	wantCursor(t, w, cs, "orders", "billing")
	got, err := cs.Load(w.ctx, "orders", "billing", 0)
	must(t, err, "Load of 0 queues")
	if len(got) != 0 {
		t.Fatalf("Load of 0 queues = %v, want empty", got)
	}
}

func (s *cursorSuite) roundTrip(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	commit(t, w, cs, "orders", "billing", 0, 5)
	commit(t, w, cs, "orders", "billing", 2, 7)
	commit(t, w, cs, "orders", "shipping", 1, 3)
	commit(t, w, cs, "payments", "billing", 0, 11)
	commit(t, w, cs, "orders", "billing", 3, 0)
	wantCursor(t, w, cs, "orders", "billing", 5, -1, 7, 0)
	wantCursor(t, w, cs, "orders", "billing", 5, -1)
	wantCursor(t, w, cs, "orders", "billing", 5, -1, 7, 0, -1, -1)
	wantCursor(t, w, cs, "orders", "shipping", -1, 3, -1, -1)
	wantCursor(t, w, cs, "payments", "billing", 11, -1)
	wantCursor(t, w, cs, "payments", "shipping", -1, -1)
	wantCursor(t, w, cs, "ordersx", "billing", -1, -1)
	big := int64(1) << 60
	commit(t, w, cs, "orders", "billing", 1, big)
	wantCursor(t, w, cs, "orders", "billing", 5, big, 7, 0)
}

func (s *cursorSuite) replace(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	commit(t, w, cs, "orders", "billing", 0, 10)
	commit(t, w, cs, "orders", "billing", 0, 20)
	wantCursor(t, w, cs, "orders", "billing", 20)
	commit(t, w, cs, "orders", "billing", 0, 4) // a reset
	wantCursor(t, w, cs, "orders", "billing", 4)
}

func (s *cursorSuite) invalid(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	commit(t, w, cs, "orders", "billing", 0, 10)
	for _, topic := range []string{"", "..", "a/b", "a b"} {
		_, err := cs.Load(w.ctx, topic, "billing", 1)
		wantErr(t, err, ferry.ErrInvalidTopic, fmt.Sprintf("Load of topic %q", topic))
		wantErr(t, cs.Commit(w.ctx, topic, "billing", 0, 1), ferry.ErrInvalidTopic, fmt.Sprintf("Commit to topic %q", topic))
	}
	_, err := cs.Load(w.ctx, "orders", "billing", -1)
	wantErr(t, err, ferry.ErrInvalidTopic, "Load of -1 queues")
	for _, c := range []struct {
		group        string
		queue        int
		offset       int64
		what         string
		ignoreInLoad bool
	}{
		{"", 0, 1, "empty group", false},
		{"billing", -1, 1, "negative queue", true},
		{"billing", 0, -1, "negative offset", true},
		{"billing", 0, -5, "negative offset", true},
	} {
		if err := cs.Commit(w.ctx, "orders", c.group, c.queue, c.offset); err == nil {
			t.Fatalf("Commit with %s (group %q, queue %d, offset %d) returned no error", c.what, c.group, c.queue, c.offset)
		}
		if !c.ignoreInLoad {
			if _, err := cs.Load(w.ctx, "orders", c.group, 1); err == nil {
				t.Fatalf("Load with %s returned no error", c.what)
			}
		}
	}
	wantCursor(t, w, cs, "orders", "billing", 10, -1)
}

// longNames are topic and group names that share long prefixes: up to
// the longest topic (249 bytes) and group (255 bytes) allowed.
func longNames() (topics, groups []string) {
	long := strings.Repeat("t", 240)
	topics = []string{"orders.europe.west", "orders.europe.east", "orders.europe", long + "-a", long + "-bbbbbbb"}
	groups = []string{"billing-service-a", "billing-service-b", "billing-service", strings.Repeat("g", 254) + "a", strings.Repeat("g", 254) + "b"}
	return topics, groups
}

func (s *cursorSuite) sharedPrefixes(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	topics, groups := longNames()
	for i, topic := range topics {
		for j, group := range groups {
			commit(t, w, cs, topic, group, 0, int64(100*i+j))
		}
	}
	for i, topic := range topics {
		for j, group := range groups {
			wantCursor(t, w, cs, topic, group, int64(100*i+j))
		}
	}
}

// wideQueues are queue indexes that agree in their low byte or bytes.
var wideQueues = []int{0, 1, 44, 255, 256, 257, 300, 511, 512, 0xff00, ferry.MaxQueues - 1}

func (s *cursorSuite) wideQueues(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	for i, q := range wideQueues {
		commit(t, w, cs, "orders", "billing", q, int64(1000+i))
	}
	checkWideQueues(t, w, cs, "orders", "billing")
}

func checkWideQueues(t *testing.T, w *watchdog, cs ferry.CursorStore, topic, group string) {
	t.Helper()
	got, err := cs.Load(w.ctx, topic, group, ferry.MaxQueues)
	must(t, err, fmt.Sprintf("Load(%s, %s, %d)", topic, group, ferry.MaxQueues))
	if len(got) != ferry.MaxQueues {
		t.Fatalf("Load(%s, %s, %d) returned %d offsets", topic, group, ferry.MaxQueues, len(got))
	}
	for q, off := range got {
		want := int64(-1)
		if i := slices.Index(wideQueues, q); i >= 0 {
			want = int64(1000 + i)
		}
		if off != want {
			t.Fatalf("Load(%s, %s, %d)[%d] = %d, want %d (queues committed: %v)", topic, group, ferry.MaxQueues, q, off, want, wideQueues)
		}
	}
}

func (s *cursorSuite) callerOwnsSlice(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	commit(t, w, cs, "orders", "billing", 1, 9)
	got, err := cs.Load(w.ctx, "orders", "billing", 3)
	must(t, err, "Load")
	for i := range got {
		got[i] = 42
	}
	wantCursor(t, w, cs, "orders", "billing", -1, 9, -1)
}

func (s *cursorSuite) concurrent(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	const groups, queues, rounds = 4, 8, 5
	errs := make([]error, groups*queues)
	var wg sync.WaitGroup
	for g := range groups {
		for q := range queues {
			wg.Go(func() {
				group := "group-" + strconv.Itoa(g)
				for r := range rounds {
					if err := cs.Commit(w.ctx, "orders", group, q, int64(100*g+10*q+r)); err != nil {
						errs[g*queues+q] = err
						return
					}
				}
				// Everybody also races on queue 0 of group "shared".
				if err := cs.Commit(w.ctx, "orders", "shared", 0, int64(g*queues+q)); err != nil {
					errs[g*queues+q] = err
				}
			})
		}
	}
	wg.Wait()
	must(t, errors.Join(errs...), "concurrent Commit")
	for g := range groups {
		want := make([]int64, queues)
		for q := range want {
			want[q] = int64(100*g + 10*q + rounds - 1)
		}
		wantCursor(t, w, cs, "orders", "group-"+strconv.Itoa(g), want...)
	}
	got, err := cs.Load(w.ctx, "orders", "shared", 1)
	must(t, err, "Load of the shared group")
	if len(got) != 1 || got[0] < 0 || got[0] >= groups*queues {
		t.Fatalf("Load of a queue committed concurrently = %v, want one of the committed offsets [0, %d)", got, groups*queues)
	}
}

func (s *cursorSuite) reopen(t *testing.T, w *watchdog) {
	dir := t.TempDir()
	cs := s.openAt(t, w, dir)
	commit(t, w, cs, "orders", "billing", 0, 5)
	commit(t, w, cs, "orders", "billing", 2, 7)
	commit(t, w, cs, "orders", "billing", 2, 8)
	commit(t, w, cs, "payments", "shipping", 1, 3)
	topics, groups := longNames()
	for i, topic := range topics {
		commit(t, w, cs, topic, groups[i], 0, int64(i))
	}
	for i, q := range wideQueues {
		commit(t, w, cs, "wide", "billing", q, int64(1000+i))
	}
	must(t, cs.Close(), "Close")
	cs = s.openAt(t, w, dir)
	if !s.f.Persistent {
		_, err := cs.Load(w.ctx, "orders", "billing", 3)
		must(t, err, "Load after reopen")
		return
	}
	wantCursor(t, w, cs, "orders", "billing", 5, -1, 8)
	wantCursor(t, w, cs, "payments", "shipping", -1, 3)
	for i, topic := range topics {
		for j, group := range groups {
			want := int64(-1)
			if i == j {
				want = int64(i)
			}
			wantCursor(t, w, cs, topic, group, want)
		}
	}
	checkWideQueues(t, w, cs, "wide", "billing")
	commit(t, w, cs, "orders", "billing", 1, 1)
	wantCursor(t, w, cs, "orders", "billing", 5, 1, 8)
}

func (s *cursorSuite) close(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	commit(t, w, cs, "orders", "billing", 0, 5)
	must(t, cs.Close(), "Close")
	must(t, cs.Close(), "second Close")
	_, err := cs.Load(w.ctx, "orders", "billing", 1)
	wantErr(t, err, ferry.ErrClosed, "Load after Close")
	wantErr(t, cs.Commit(w.ctx, "orders", "billing", 0, 6), ferry.ErrClosed, "Commit after Close")
	if g, ok := cs.(ferry.CursorGroups); ok {
		_, err := g.Cursors(w.ctx, "orders", 1)
		wantErr(t, err, ferry.ErrClosed, "Cursors after Close")
		wantErr(t, g.Forget(w.ctx, "orders", "billing"), ferry.ErrClosed, "Forget after Close")
	}
	if f, ok := cs.(ferry.FencedCursorStore); ok {
		wantErr(t, f.CommitFenced(w.ctx, "orders", "billing", 0, 6, 1), ferry.ErrClosed, "CommitFenced after Close")
	}
}
