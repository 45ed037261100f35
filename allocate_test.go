package ferry_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every allocator runs the conformance suite.

func TestAllocateAveragelyConformance(t *testing.T) {
	ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator { return ferry.AllocateAveragely() })
}

func TestAllocateAveragelyByCircleConformance(t *testing.T) {
	ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator { return ferry.AllocateAveragelyByCircle() })
}

func TestAllocateConsistentHashConformance(t *testing.T) {
	for _, v := range []int{0, 1, 7} {
		t.Run(fmt.Sprint(v, "vnodes"), func(t *testing.T) {
			ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator { return ferry.AllocateConsistentHash(v) })
		})
	}
}

// TestAllocateByConfigConformance configures each member with its own
// share (the averaged one, listed backwards, with queues that are not
// offered), as a deployment must for the one-owner rule to hold.
func TestAllocateByConfigConformance(t *testing.T) {
	ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator {
		return ferry.AllocatorFunc(func(group, self string, queues []ferry.QueueID, members []string) []ferry.QueueID {
			list := ferry.AllocateAveragely().Allocate(group, self, queues, members)
			slices.Reverse(list)
			list = append(list, ferry.QueueID{Topic: "not-offered", Queue: 0}, ferry.QueueID{Topic: "topic-0", Queue: 1 << 20})
			return ferry.AllocateByConfig(list...).Allocate(group, self, queues, members)
		})
	})
}

func queues(topic string, n int) []ferry.QueueID {
	out := make([]ferry.QueueID, n)
	for i := range out {
		out[i] = ferry.QueueID{Topic: topic, Queue: i}
	}
	return out
}

func members(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("member-%02d", i)
	}
	return out
}

// split returns every member's allocation, as queue numbers.
func split(a ferry.Allocator, nq, nm int) [][]int {
	qs, ms := queues("orders", nq), members(nm)
	out := make([][]int, nm)
	for i, m := range ms {
		out[i] = []int{}
		for _, q := range a.Allocate("group", m, qs, ms) {
			out[i] = append(out[i], q.Queue)
		}
	}
	return out
}

// TestAllocateRocketMQTables checks the results RocketMQ's strategies give
// for the same sorted input.
func TestAllocateRocketMQTables(t *testing.T) {
	for _, tc := range []struct {
		name   string
		a      ferry.Allocator
		nq, nm int
		want   [][]int
	}{
		{"averagely 8/3", ferry.AllocateAveragely(), 8, 3, [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7}}},
		{"averagely 10/4", ferry.AllocateAveragely(), 10, 4, [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7}, {8, 9}}},
		{"averagely 6/3", ferry.AllocateAveragely(), 6, 3, [][]int{{0, 1}, {2, 3}, {4, 5}}},
		{"averagely 3/5", ferry.AllocateAveragely(), 3, 5, [][]int{{0}, {1}, {2}, {}, {}}},
		{"averagely 5/1", ferry.AllocateAveragely(), 5, 1, [][]int{{0, 1, 2, 3, 4}}},
		{"circle 8/3", ferry.AllocateAveragelyByCircle(), 8, 3, [][]int{{0, 3, 6}, {1, 4, 7}, {2, 5}}},
		{"circle 10/4", ferry.AllocateAveragelyByCircle(), 10, 4, [][]int{{0, 4, 8}, {1, 5, 9}, {2, 6}, {3, 7}}},
		{"circle 3/5", ferry.AllocateAveragelyByCircle(), 3, 5, [][]int{{0}, {1}, {2}, {}, {}}},
		{"circle 5/1", ferry.AllocateAveragelyByCircle(), 5, 1, [][]int{{0, 1, 2, 3, 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, split(tc.a, tc.nq, tc.nm))
		})
	}
}

// TestAllocateConsistentHashStable pins the ring: the same input must give
// the same split in every version, or upgrading members would disagree.
func TestAllocateConsistentHashStable(t *testing.T) {
	assert.Equal(t, [][]int{{4, 5, 6}, {0, 1, 2, 3}, {7}}, split(ferry.AllocateConsistentHash(0), 8, 3))
	assert.Equal(t, [][]int{{4}, {0, 2, 3}, {1, 5, 6, 7}}, split(ferry.AllocateConsistentHash(10), 8, 3))
	assert.Equal(t, split(ferry.AllocateConsistentHash(ferry.DefaultVirtualNodes), 40, 6), split(ferry.AllocateConsistentHash(-5), 40, 6))
	assert.Equal(t, split(ferry.AllocateConsistentHash(4096), 40, 6), split(ferry.AllocateConsistentHash(1<<40), 40, 6), "a huge count is capped")
}

// TestAllocateConsistentHashMovesLittle checks what consistent hashing is
// for: when a member joins, only queues it takes change owner.
func TestAllocateConsistentHashMovesLittle(t *testing.T) {
	a := ferry.AllocateConsistentHash(50)
	for nm := 1; nm < 12; nm++ {
		qs := queues("orders", 64)
		before, after := members(nm), members(nm+1)
		owner := map[ferry.QueueID]string{}
		for _, m := range before {
			for _, q := range a.Allocate("g", m, qs, before) {
				owner[q] = m
			}
		}
		joined := after[nm]
		taken := a.Allocate("g", joined, qs, after)
		for _, m := range before {
			for _, q := range a.Allocate("g", m, qs, after) {
				require.Equal(t, owner[q], m, "queue %v moved from %s to %s when %s joined", q, owner[q], m, joined)
			}
		}
		// The newcomer takes about its share: between none and twice it.
		require.LessOrEqual(t, len(taken), 2*64/(nm+1)+2, "%s took %d of 64 queues from %d members", joined, len(taken), nm)
	}
	// And with many queues the split is roughly even.
	for i, share := range split(ferry.AllocateConsistentHash(0), 1000, 4) {
		assert.InDelta(t, 250, len(share), 60, "member %d got %d of 1000 queues", i, len(share))
	}
}

func TestAllocateByConfig(t *testing.T) {
	qs, ms := queues("orders", 4), members(2)
	listed := []ferry.QueueID{{Topic: "orders", Queue: 3}, {Topic: "orders", Queue: 1}, {Topic: "orders", Queue: 3}, {Topic: "orders", Queue: 9}, {Topic: "payments", Queue: 0}}
	a := ferry.AllocateByConfig(listed...)
	listed[0] = ferry.QueueID{Topic: "orders", Queue: 0} // the allocator keeps its own copy
	want := []ferry.QueueID{{Topic: "orders", Queue: 1}, {Topic: "orders", Queue: 3}}
	assert.Equal(t, want, a.Allocate("g", ms[0], qs, ms), "the listed queues that are offered, sorted, once each")
	assert.Equal(t, want, a.Allocate("g", ms[1], qs, ms), "every member gets the same list")
	assert.Empty(t, a.Allocate("g", "stranger", qs, ms))
	assert.Empty(t, a.Allocate("g", ms[0], nil, ms))
	assert.Empty(t, ferry.AllocateByConfig().Allocate("g", ms[0], qs, ms))
	got := a.Allocate("g", ms[0], qs, ms)
	got[0].Queue = 42
	assert.Equal(t, want, a.Allocate("g", ms[0], qs, ms), "the caller owns the result")
}

// TestAllocatorsReturnNilWhenNothingIsOwned: no queues, no members or a
// self that is not a member give nil, from every allocator.
func TestAllocatorsReturnNilWhenNothingIsOwned(t *testing.T) {
	for name, a := range map[string]ferry.Allocator{
		"averagely":       ferry.AllocateAveragely(),
		"circle":          ferry.AllocateAveragelyByCircle(),
		"consistent hash": ferry.AllocateConsistentHash(0),
		"config":          ferry.AllocateByConfig(queues("orders", 4)...),
	} {
		qs, ms := queues("orders", 4), members(3)
		assert.Nil(t, a.Allocate("g", "stranger", qs, ms), "%s: self not a member", name)
		assert.Nil(t, a.Allocate("g", ms[0], nil, ms), "%s: no queues", name)
		assert.Nil(t, a.Allocate("g", ms[0], []ferry.QueueID{}, ms), "%s: empty queues", name)
		assert.Nil(t, a.Allocate("g", ms[0], qs, nil), "%s: no members", name)
		assert.Nil(t, a.Allocate("g", "", qs, []string{}), "%s: empty members", name)
		owned := 0
		for _, m := range ms {
			owned += len(a.Allocate("g", m, qs, ms))
		}
		assert.GreaterOrEqual(t, owned, len(qs), "%s: the members own every queue", name)
	}
}

// BenchmarkAllocate measures one member's Allocate for 64 queues and 16
// members; "cold" rebuilds the consistent-hash ring every time (a new
// member list), "warm" reuses it (every member asking in one rebalance).
func BenchmarkAllocate(b *testing.B) {
	qs, ms := queues("orders", 64), members(16)
	for _, bc := range []struct {
		name string
		a    func() ferry.Allocator
	}{
		{"averagely", ferry.AllocateAveragely},
		{"circle", ferry.AllocateAveragelyByCircle},
		{"consistent-hash-warm", func() ferry.Allocator { return ferry.AllocateConsistentHash(0) }},
		{"consistent-hash-cold", nil},
		{"config", func() ferry.Allocator { return ferry.AllocateByConfig(qs[:4]...) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			if bc.a == nil {
				for i := 0; b.Loop(); i++ {
					ferry.AllocateConsistentHash(0).Allocate("g", ms[i%16], qs, ms)
				}
				return
			}
			a := bc.a()
			for i := 0; b.Loop(); i++ {
				a.Allocate("g", ms[i%16], qs, ms)
			}
		})
	}
}
