package ferrytest

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/ferrymq/ferry"
)

// AllocatorFactory returns the allocator under test. The suite asks for a
// fresh one per subtest and, to check that members agree without talking,
// for several within one.
type AllocatorFactory func(t *testing.T) ferry.Allocator

// TestAllocator checks that the allocators newAllocator returns keep the
// contract of [ferry.Allocator], for every queue count from 0 to 64 (in
// one topic, and some spread over two) and every member count from 1 to
// 20 (sparser with -short):
//
//   - OneOwner: across all members every queue has exactly one owner, and
//     nobody gets a queue that was not offered or a queue twice.
//   - SameAnswer: every member's answer is the same from a second
//     allocator and on a second call, so members agree without talking.
//   - InputsUntouched: Allocate does not modify queues or members, and the
//     caller owns the slice it returns.
//   - Edges: zero queues (nil or empty), no members, and a self that is not
//     a member give an empty answer, never a panic.
//
// A panic in Allocate fails the test, naming the allocator. Broadcast
// allocation, which gives every queue to every member by design, does not
// pass this suite.
func TestAllocator(t *testing.T, newAllocator AllocatorFactory) {
	t.Helper()
	f := Features{}
	as := &allocSuite{newAllocator: newAllocator, short: testing.Short()}
	run(t, f, "OneOwner", as.oneOwner)
	run(t, f, "SameAnswer", as.sameAnswer)
	run(t, f, "InputsUntouched", as.inputsUntouched)
	run(t, f, "Edges", as.edges)
}

type allocSuite struct {
	newAllocator AllocatorFactory
	short        bool
}

func (s *allocSuite) alloc(t *testing.T) ferry.Allocator {
	t.Helper()
	a := s.newAllocator(t)
	if a == nil {
		t.Fatal("ferrytest: the allocator factory returned nil")
	}
	return a
}

// allocCase is one input of the grid.
type allocCase struct {
	group   string
	queues  []ferry.QueueID
	members []string
}

func (c allocCase) String() string {
	return fmt.Sprintf("group %q, %d queues, %d members", c.group, len(c.queues), len(c.members))
}

// grid returns the inputs the suite tries: 0..64 queues of one topic and
// some counts split over two topics, for 1..20 members.
func (s *allocSuite) grid() []allocCase {
	var out []allocCase
	for nm := 1; nm <= 20; nm++ {
		if s.short && nm > 6 && nm%5 != 0 {
			continue
		}
		members := memberIDs(nm)
		for nq := 0; nq <= 64; nq++ {
			if s.short && nq > 16 && nq%7 != 0 {
				continue
			}
			out = append(out, allocCase{"group-" + strconv.Itoa(nq%3), queueIDs(nq, 1), members})
			if nq%8 == 3 || nq == 64 {
				out = append(out, allocCase{"group-x", queueIDs(nq, 2), members})
			}
		}
	}
	return out
}

// queueIDs returns n queues spread over topics topics, sorted.
func queueIDs(n, topics int) []ferry.QueueID {
	out := make([]ferry.QueueID, 0, n)
	per := (n + topics - 1) / max(topics, 1)
	for i := range n {
		out = append(out, ferry.QueueID{Topic: "topic-" + strconv.Itoa(i/max(per, 1)), Queue: i % max(per, 1)})
	}
	slices.SortFunc(out, ferry.QueueID.Compare)
	return out
}

// memberIDs returns n member IDs shaped like real ones, sorted.
func memberIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "10.0.0." + strconv.Itoa(i+1) + "@" + strconv.Itoa(4000+i*37)
	}
	slices.Sort(out)
	return out
}

// allocate calls a.Allocate, turning a panic into a test failure.
func allocate(t *testing.T, a ferry.Allocator, c allocCase, self string) (got []ferry.QueueID) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("allocator %T panicked for member %q, %v: %v", a, self, c, r)
		}
	}()
	return a.Allocate(c.group, self, c.queues, c.members)
}

func (s *allocSuite) oneOwner(t *testing.T, w *watchdog) {
	a := s.alloc(t)
	for _, c := range s.grid() {
		owner := make(map[ferry.QueueID]string, len(c.queues))
		for _, q := range c.queues {
			owner[q] = ""
		}
		for _, m := range c.members {
			for _, q := range allocate(t, a, c, m) {
				prev, offered := owner[q]
				switch {
				case !offered:
					t.Fatalf("allocator %T gave member %q queue %v, which was not offered (%v)", a, m, q, c)
				case prev != "":
					t.Fatalf("allocator %T gave queue %v to both %q and %q (%v)", a, q, prev, m, c)
				}
				owner[q] = m
			}
		}
		for _, q := range c.queues {
			if owner[q] == "" {
				t.Fatalf("allocator %T gave queue %v to no member (%v)", a, q, c)
			}
		}
		if w.ctx.Err() != nil {
			return
		}
		w.progress()
	}
}

func (s *allocSuite) sameAnswer(t *testing.T, w *watchdog) {
	a, b := s.alloc(t), s.alloc(t)
	for _, c := range s.grid() {
		for _, m := range c.members {
			first := allocate(t, a, c, m)
			if again := allocate(t, a, c, m); !slices.Equal(first, again) {
				t.Fatalf("allocator %T answered member %q %v, then %v (%v)", a, m, first, again, c)
			}
			if other := allocate(t, b, c, m); !slices.Equal(first, other) {
				t.Fatalf("two allocators %T answered member %q %v and %v (%v)", a, m, first, other, c)
			}
		}
		if w.ctx.Err() != nil {
			return
		}
		w.progress()
	}
}

func (s *allocSuite) inputsUntouched(t *testing.T, w *watchdog) {
	a := s.alloc(t)
	for _, c := range s.grid() {
		queues, members := slices.Clone(c.queues), slices.Clone(c.members)
		for _, m := range c.members {
			got := allocate(t, a, c, m)
			if !slices.Equal(c.queues, queues) || !slices.Equal(c.members, members) {
				t.Fatalf("allocator %T modified its input for member %q (%v)", a, m, c)
			}
			want := slices.Clone(got)
			for i := range got {
				got[i] = ferry.QueueID{Topic: "scribbled", Queue: -1}
			}
			if again := allocate(t, a, c, m); !slices.Equal(again, want) {
				t.Fatalf("allocator %T: changing the slice it returned changed its next answer for member %q from %v to %v (%v)", a, m, want, again, c)
			}
			if !slices.Equal(c.queues, queues) {
				t.Fatalf("allocator %T returned a slice aliasing its queues input (%v)", a, c)
			}
		}
		if w.ctx.Err() != nil {
			return
		}
		w.progress()
	}
}

func (s *allocSuite) edges(t *testing.T, w *watchdog) {
	a := s.alloc(t)
	members := memberIDs(3)
	cases := []struct {
		c    allocCase
		self string
		what string
	}{
		{allocCase{"g", nil, members}, members[0], "nil queues"},
		{allocCase{"g", []ferry.QueueID{}, members}, members[1], "no queues"},
		{allocCase{"g", queueIDs(8, 1), nil}, members[0], "nil members"},
		{allocCase{"g", queueIDs(8, 1), []string{}}, "", "no members, empty self"},
		{allocCase{"g", queueIDs(8, 1), members}, "stranger", "self not a member"},
		{allocCase{"g", queueIDs(8, 1), members}, "", "empty self"},
		{allocCase{"", queueIDs(0, 1), nil}, "", "nothing at all"},
	}
	for _, tc := range cases {
		if got := allocate(t, a, tc.c, tc.self); len(got) != 0 {
			t.Fatalf("allocator %T with %s returned %v, want nothing", a, tc.what, got)
		}
	}
	// A single member owns everything; an empty group name is no reason to fail.
	c := allocCase{"", queueIDs(5, 1), members[:1]}
	if got := allocate(t, a, c, members[0]); len(got) != 5 {
		t.Fatalf("allocator %T gave the only member %v of 5 queues", a, got)
	}
}
