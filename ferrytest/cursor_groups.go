package ferrytest

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/ferrymq/ferry"
)

// The cursor suite's cases of group listing, forgetting, fencing and
// handoff.

// cursorGroups returns cs as a [ferry.CursorGroups], skipping the subtest
// if it is not one.
func cursorGroups(t *testing.T, cs ferry.CursorStore) ferry.CursorGroups {
	t.Helper()
	g, ok := cs.(ferry.CursorGroups)
	if !ok {
		t.Skipf("ferrytest: %T does not implement ferry.CursorGroups", cs)
	}
	return g
}

// wantGroups checks that Cursors(topic, queues) lists exactly want.
func wantGroups(t *testing.T, w *watchdog, g ferry.CursorGroups, topic string, queues int, want map[string][]int64) {
	t.Helper()
	got, err := g.Cursors(w.ctx, topic, queues)
	must(t, err, fmt.Sprintf("Cursors(%s, %d)", topic, queues))
	if got.Topic != topic {
		t.Fatalf("Cursors(%s, %d).Topic = %q", topic, queues, got.Topic)
	}
	if len(got.Groups) != len(want) {
		t.Fatalf("Cursors(%s, %d) lists groups %v, want %v", topic, queues, slices.Sorted(maps.Keys(got.Groups)), slices.Sorted(maps.Keys(want)))
	}
	for name, offs := range want {
		c, ok := got.Groups[name]
		if !ok {
			t.Fatalf("Cursors(%s, %d) lists groups %v: %q missing", topic, queues, slices.Sorted(maps.Keys(got.Groups)), name)
		}
		if c.Group != name {
			t.Fatalf("Cursors(%s, %d): the cursor of group %q says Group %q", topic, queues, name, c.Group)
		}
		if !slices.Equal(c.Offsets, offs) {
			t.Fatalf("Cursors(%s, %d): group %q has offsets %v, want %v", topic, queues, name, c.Offsets, offs)
		}
	}
}

func (s *cursorSuite) groups(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	g := cursorGroups(t, cs)
	wantGroups(t, w, g, "orders", 3, nil)
	commit(t, w, cs, "orders", "billing", 0, 5)
	commit(t, w, cs, "orders", "billing", 2, 7)
	commit(t, w, cs, "orders", "shipping", 1, 3)
	commit(t, w, cs, "payments", "audit", 0, 11)
	commit(t, w, cs, "orders.eu", "audit", 0, 12) // a topic sharing a prefix
	wantGroups(t, w, g, "orders", 3, map[string][]int64{"billing": {5, -1, 7}, "shipping": {-1, 3, -1}})
	wantGroups(t, w, g, "orders", 2, map[string][]int64{"billing": {5, -1}, "shipping": {-1, 3}})
	wantGroups(t, w, g, "orders", 5, map[string][]int64{"billing": {5, -1, 7, -1, -1}, "shipping": {-1, 3, -1, -1, -1}})
	wantGroups(t, w, g, "payments", 2, map[string][]int64{"audit": {11, -1}})
	wantGroups(t, w, g, "refunds", 2, nil)

	got, err := g.Cursors(w.ctx, "orders", 3)
	must(t, err, "Cursors")
	for name, c := range got.Groups {
		for i := range c.Offsets {
			c.Offsets[i] = 42
		}
		delete(got.Groups, name)
	}
	wantGroups(t, w, g, "orders", 3, map[string][]int64{"billing": {5, -1, 7}, "shipping": {-1, 3, -1}})
	wantCursor(t, w, cs, "orders", "billing", 5, -1, 7)

	for _, topic := range []string{"", "..", "a b"} {
		_, err := g.Cursors(w.ctx, topic, 1)
		wantErr(t, err, ferry.ErrInvalidTopic, fmt.Sprintf("Cursors of topic %q", topic))
	}
	_, err = g.Cursors(w.ctx, "orders", -1)
	wantErr(t, err, ferry.ErrInvalidTopic, "Cursors of -1 queues")
}

func (s *cursorSuite) forget(t *testing.T, w *watchdog) {
	dir := t.TempDir()
	cs := s.openAt(t, w, dir)
	g := cursorGroups(t, cs)
	commit(t, w, cs, "orders", "billing", 0, 5)
	commit(t, w, cs, "orders", "billing", 2, 7)
	commit(t, w, cs, "orders", "shipping", 1, 3)
	commit(t, w, cs, "payments", "billing", 0, 11)
	commit(t, w, cs, "orders.eu", "billing", 0, 12)

	must(t, g.Forget(w.ctx, "orders", "billing"), "Forget")
	wantCursor(t, w, cs, "orders", "billing", -1, -1, -1)
	wantGroups(t, w, g, "orders", 3, map[string][]int64{"shipping": {-1, 3, -1}})
	wantCursor(t, w, cs, "orders", "shipping", -1, 3, -1)
	wantCursor(t, w, cs, "payments", "billing", 11)
	wantCursor(t, w, cs, "orders.eu", "billing", 12)
	wantGroups(t, w, g, "payments", 1, map[string][]int64{"billing": {11}})

	must(t, g.Forget(w.ctx, "orders", "billing"), "Forget of a forgotten group")
	must(t, g.Forget(w.ctx, "orders", "nobody"), "Forget of a group without cursors")
	must(t, g.Forget(w.ctx, "refunds", "billing"), "Forget on a topic without cursors")
	wantGroups(t, w, g, "orders", 3, map[string][]int64{"shipping": {-1, 3, -1}})

	commit(t, w, cs, "orders", "billing", 1, 4) // the group comes back
	wantCursor(t, w, cs, "orders", "billing", -1, 4, -1)
	wantGroups(t, w, g, "orders", 3, map[string][]int64{"billing": {-1, 4, -1}, "shipping": {-1, 3, -1}})
	must(t, g.Forget(w.ctx, "orders", "billing"), "Forget again")
	must(t, g.Forget(w.ctx, "orders", "shipping"), "Forget of the last group of a topic")
	wantGroups(t, w, g, "orders", 3, nil)

	must(t, cs.Close(), "Close")
	cs = s.openAt(t, w, dir)
	g = cursorGroups(t, cs)
	if !s.f.Persistent {
		return
	}
	wantCursor(t, w, cs, "orders", "billing", -1, -1, -1)
	wantCursor(t, w, cs, "orders", "shipping", -1, -1)
	wantGroups(t, w, g, "orders", 3, nil)
	wantCursor(t, w, cs, "payments", "billing", 11)
	wantGroups(t, w, g, "orders.eu", 1, map[string][]int64{"billing": {12}})
}

func (s *cursorSuite) fenced(t *testing.T, w *watchdog) {
	dir := t.TempDir()
	cs := s.openAt(t, w, dir)
	f, ok := cs.(ferry.FencedCursorStore)
	if !ok {
		t.Skipf("ferrytest: %T does not implement ferry.FencedCursorStore", cs)
	}
	fenced := func(topic, group string, queue int, off int64, token uint64) {
		t.Helper()
		must(t, f.CommitFenced(w.ctx, topic, group, queue, off, token), fmt.Sprintf("CommitFenced(%s, %s, %d, %d, token %d)", topic, group, queue, off, token))
	}
	refused := func(topic, group string, queue int, off int64, token uint64) {
		t.Helper()
		wantErr(t, f.CommitFenced(w.ctx, topic, group, queue, off, token), ferry.ErrFenced, fmt.Sprintf("CommitFenced(%s, %s, %d, %d) with stale token %d", topic, group, queue, off, token))
	}
	fenced("orders", "billing", 0, 10, 5)
	wantCursor(t, w, cs, "orders", "billing", 10)
	refused("orders", "billing", 0, 3, 4)
	wantCursor(t, w, cs, "orders", "billing", 10) // nothing written
	fenced("orders", "billing", 0, 11, 5)         // the same lease again
	fenced("orders", "billing", 0, 12, 7)
	wantCursor(t, w, cs, "orders", "billing", 12)
	refused("orders", "billing", 0, 20, 6)
	wantCursor(t, w, cs, "orders", "billing", 12)

	commit(t, w, cs, "orders", "billing", 0, 2) // an operator's reset
	wantCursor(t, w, cs, "orders", "billing", 2)
	refused("orders", "billing", 0, 30, 6) // the reset kept the token
	wantCursor(t, w, cs, "orders", "billing", 2)
	fenced("orders", "billing", 0, 3, 7)
	wantCursor(t, w, cs, "orders", "billing", 3)

	// Tokens are per topic, group and queue.
	fenced("orders", "billing", 1, 40, 1)
	fenced("orders", "shipping", 0, 41, 1)
	fenced("payments", "billing", 0, 42, 1)
	fenced("orders.eu", "billing", 0, 43, 1)
	fenced("orders", "billing", 256, 44, 1) // agrees with queue 0 in its low byte
	wantCursor(t, w, cs, "orders", "billing", 3, 40)
	refused("orders", "billing", 1, 45, 0)

	must(t, cs.Close(), "Close")
	cs = s.openAt(t, w, dir)
	f, ok = cs.(ferry.FencedCursorStore)
	if !ok {
		t.Fatalf("ferrytest: %T, reopened, does not implement ferry.FencedCursorStore", cs)
	}
	if !s.f.Persistent {
		return
	}
	wantCursor(t, w, cs, "orders", "billing", 3, 40)
	if !s.f.TokensPersist {
		fenced("orders", "billing", 0, 50, 3)
		refused("orders", "billing", 0, 51, 2) // fencing starts again
		return
	}
	refused("orders", "billing", 0, 50, 6) // tokens survive a reopen
	wantCursor(t, w, cs, "orders", "billing", 3, 40)
	fenced("orders", "billing", 0, 51, 7)
	wantCursor(t, w, cs, "orders", "billing", 51, 40)
}

func (s *cursorSuite) handoff(t *testing.T, w *watchdog) {
	dir := t.TempDir()
	cs := s.openAt(t, w, dir)
	hs, ok := cs.(ferry.HandoffCursorStore)
	if !ok {
		t.Skipf("ferrytest: %T does not implement ferry.HandoffCursorStore", cs)
	}
	commitSet := func(topic, group string, queue int, off int64, set []int64, token uint64) {
		t.Helper()
		must(t, hs.CommitFinished(w.ctx, topic, group, queue, off, set, token), fmt.Sprintf("CommitFinished(%s, %s, %d, %d, %v, token %d)", topic, group, queue, off, set, token))
	}
	take := func(topic, group string, queue int, token uint64, wantOff int64, want []int64) {
		t.Helper()
		off, got, err := hs.TakeCursor(w.ctx, topic, group, queue, token)
		must(t, err, fmt.Sprintf("TakeCursor(%s, %s, %d, token %d)", topic, group, queue, token))
		check(t, off == wantOff, "TakeCursor(%s, %s, %d) = offset %d, want %d", topic, group, queue, off, wantOff)
		if len(want) == 0 {
			check(t, got == nil, "TakeCursor(%s, %s, %d) = set %v, want nil", topic, group, queue, got)
			return
		}
		check(t, slices.Equal(got, want), "TakeCursor(%s, %s, %d) = set %v, want %v", topic, group, queue, got, want)
	}
	take("orders", "billing", 0, 1, -1, nil) // never committed: fenced from the take on
	wantErr(t, hs.CommitFenced(w.ctx, "orders", "billing", 0, 4, 0), ferry.ErrFenced, "CommitFenced below the take's token")
	commitSet("orders", "billing", 0, 10, []int64{12, 13, 20}, 5)
	wantCursor(t, w, cs, "orders", "billing", 10)
	take("orders", "billing", 0, 5, 10, []int64{12, 13, 20})
	off, got, _ := hs.TakeCursor(w.ctx, "orders", "billing", 0, 5)
	got[0] = 99 // the caller owns it
	take("orders", "billing", 0, 5, off, []int64{12, 13, 20})

	// The next owner's take fences the old owner's late commits out.
	take("orders", "billing", 0, 7, 10, []int64{12, 13, 20})
	wantErr(t, hs.CommitFenced(w.ctx, "orders", "billing", 0, 30, 5), ferry.ErrFenced, "the old owner's late commit")
	wantErr(t, hs.CommitFinished(w.ctx, "orders", "billing", 0, 30, []int64{31}, 6), ferry.ErrFenced, "the old owner's late CommitFinished")
	_, _, err := hs.TakeCursor(w.ctx, "orders", "billing", 0, 6)
	wantErr(t, err, ferry.ErrFenced, "TakeCursor with a stale token")
	wantCursor(t, w, cs, "orders", "billing", 10)
	take("orders", "billing", 0, 7, 10, []int64{12, 13, 20})

	// Bad sets write nothing.
	for _, bad := range [][]int64{{10}, {9, 12}, {14, 12}, {12, 12}, make([]int64, ferry.MaxFinishedSet+1)} {
		if len(bad) > ferry.MaxFinishedSet {
			for i := range bad {
				bad[i] = 11 + int64(i)
			}
		}
		wantErr(t, hs.CommitFinished(w.ctx, "orders", "billing", 0, 10, bad, 7), ferry.ErrInvalidOption, fmt.Sprintf("CommitFinished with the set %v", bad[:min(len(bad), 3)]))
	}
	take("orders", "billing", 0, 7, 10, []int64{12, 13, 20})

	// Sets are per topic, group and queue.
	commitSet("orders", "billing", 1, 3, []int64{5}, 1)
	commitSet("orders", "shipping", 0, 3, []int64{6}, 1)
	commitSet("orders.eu", "billing", 0, 3, []int64{7}, 1)
	take("orders", "billing", 0, 7, 10, []int64{12, 13, 20})
	take("orders", "billing", 1, 1, 3, []int64{5})
	take("orders", "shipping", 0, 1, 3, []int64{6})
	take("orders.eu", "billing", 0, 1, 3, []int64{7})
	take("orders", "billing", 2, 1, -1, nil)

	// Any other commit empties the queue's set.
	must(t, hs.CommitFenced(w.ctx, "orders", "billing", 1, 4, 1), "CommitFenced")
	take("orders", "billing", 1, 1, 4, nil)
	commit(t, w, cs, "orders", "shipping", 0, 4)
	take("orders", "shipping", 0, 1, 4, nil)
	commitSet("orders", "billing", 1, 5, nil, 1) // an empty set: a fenced commit
	wantCursor(t, w, cs, "orders", "billing", 10, 5)

	if cg, ok := cs.(ferry.CursorGroups); ok {
		must(t, cg.Forget(w.ctx, "orders.eu", "billing"), "Forget")
		take("orders.eu", "billing", 0, 1, -1, nil)
	}

	must(t, cs.Close(), "Close")
	cs = s.openAt(t, w, dir)
	if hs, ok = cs.(ferry.HandoffCursorStore); !ok {
		t.Fatalf("ferrytest: %T, reopened, does not implement ferry.HandoffCursorStore", cs)
	}
	if !s.f.Persistent {
		return
	}
	wantCursor(t, w, cs, "orders", "billing", 10, 5)
	take("orders", "billing", 0, 8, 10, []int64{12, 13, 20})
	take("orders", "billing", 1, 8, 5, nil)
}
