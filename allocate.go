package ferry

import (
	"slices"
	"strconv"
	"sync"
)

// Allocator picks which queues a member of a consumer group owns.
//
// Allocate returns the queues member self owns. queues and members are
// sorted (queues by [QueueID.Compare], members as strings), without
// duplicates, and self is one of members. It must be deterministic: every
// member computes the same split from the same inputs without talking to
// the others, and across all members every queue must have exactly one
// owner. The broker checks the split and reports an allocator that breaks
// this rule, naming it. Allocate must not modify its inputs or panic; the
// returned slice is the caller's.
//
// Allocator is a building block (see the package doc): the members and
// queues may be a foreign system's workers and partitions (see the
// example).
type Allocator interface {
	Allocate(group, self string, queues []QueueID, members []string) []QueueID
}

// AllocatorFunc adapts a function to an [Allocator].
type AllocatorFunc func(group, self string, queues []QueueID, members []string) []QueueID

// Allocate calls f.
func (f AllocatorFunc) Allocate(group, self string, queues []QueueID, members []string) []QueueID {
	return f(group, self, queues, members)
}

// memberIndex returns the position of self in members, or -1.
func memberIndex(self string, members []string) int {
	for i, m := range members {
		if m == self {
			return i
		}
	}
	return -1
}

// AllocateAveragely returns the default allocator, RocketMQ's
// AllocateMessageQueueAveragely: the queues are cut into contiguous blocks,
// one per member in order, the first len(queues) % len(members) blocks one
// queue larger; members past the queue count get nothing. For 8 queues and 3
// members: {0,1,2}, {3,4,5}, {6,7}.
func AllocateAveragely() Allocator { return AllocatorFunc(allocateAveragely) }

func allocateAveragely(_, self string, queues []QueueID, members []string) []QueueID {
	idx := memberIndex(self, members)
	if idx < 0 || len(queues) == 0 {
		return nil
	}
	nq, nm := len(queues), len(members)
	mod := nq % nm
	avg := 1
	if nq > nm {
		avg = nq / nm
		if idx < mod {
			avg++
		}
	}
	start := idx*avg + mod
	if idx < mod {
		start = idx * avg
	}
	if start >= nq {
		return nil
	}
	n := min(avg, nq-start)
	return append([]QueueID(nil), queues[start:start+n]...)
}

// AllocateAveragelyByCircle returns RocketMQ's
// AllocateMessageQueueAveragelyByCircle: queue i (in sorted order) goes to
// member i % len(members), dealing the queues round like cards. Members
// past the queue count get nothing. For 8 queues and 3 members: {0,3,6},
// {1,4,7}, {2,5}.
func AllocateAveragelyByCircle() Allocator { return AllocatorFunc(allocateByCircle) }

func allocateByCircle(_, self string, queues []QueueID, members []string) []QueueID {
	idx := memberIndex(self, members)
	if idx < 0 || idx >= len(queues) {
		return nil
	}
	out := make([]QueueID, 0, (len(queues)-idx+len(members)-1)/len(members))
	for i := idx; i < len(queues); i += len(members) {
		out = append(out, queues[i])
	}
	return out
}

// DefaultVirtualNodes is the number of points per member on the hash ring
// of [AllocateConsistentHash] when it is given fewer than 1.
const DefaultVirtualNodes = 100

// maxVirtualNodes bounds the points per member, so that a huge count
// cannot exhaust memory.
const maxVirtualNodes = 4096

// AllocateConsistentHash returns an allocator that places virtualNodes
// points per member on a hash ring and gives each queue to the member of
// the first point at or after the queue's hash, wrapping around. When a
// member joins or leaves, only the queues next to its points move, unlike
// the averaging allocators, which shift most queues. The price is balance:
// shares are even only on average, so with few queues per member some get
// more than others (or none); prefer [AllocateAveragely] then.
//
// The hash is stable across processes, versions and platforms: 64-bit
// FNV-1a of a key, then the finalizer of MurmurHash3 (fmix64) to spread
// similar keys. A member's points hash "<member>#<i>" for i in
// [0, virtualNodes); a queue hashes [QueueID.String] ("topic[queue]"). A
// point two members hash to belongs to the one that sorts first, so the
// ring is the same for everybody. virtualNodes < 1 means
// [DefaultVirtualNodes]; more than 4096 means 4096. More points balance
// better and cost a little more per rebalance (the ring has
// len(members)*virtualNodes points; the allocator keeps the ring of the
// last member list it saw).
//
// The split differs from RocketMQ's (whose Go and Java clients differ from
// each other too); it is Ferry's own, fixed from this version on. The
// allocator is safe for concurrent use.
func AllocateConsistentHash(virtualNodes int) Allocator {
	if virtualNodes < 1 {
		virtualNodes = DefaultVirtualNodes
	}
	return &consistentHash{vnodes: min(virtualNodes, maxVirtualNodes)}
}

// consistentHash keeps the ring of the last members it saw: every member
// of a group (and the broker checking the split) asks with the same list.
type consistentHash struct {
	vnodes int

	mu      sync.Mutex // guards members and ring
	members []string
	ring    *hashRing // immutable once stored
}

// hashRing is the sorted points of a ring and the member owning each.
type hashRing struct {
	points []uint64
	owner  map[uint64]int // point -> member index
}

// Allocate implements [Allocator].
func (c *consistentHash) Allocate(_, self string, queues []QueueID, members []string) []QueueID {
	idx := memberIndex(self, members)
	if idx < 0 || len(queues) == 0 {
		return nil
	}
	ring := c.ringOf(members)
	var key []byte
	var out []QueueID
	for _, q := range queues {
		key = append(append(append(append(key[:0], q.Topic...), '['), strconv.Itoa(q.Queue)...), ']')
		i, _ := slices.BinarySearch(ring.points, ringHash(key))
		if i == len(ring.points) {
			i = 0
		}
		if ring.owner[ring.points[i]] == idx {
			out = append(out, q)
		}
	}
	return out
}

// ringOf returns the ring of members, from the cache when it can.
func (c *consistentHash) ringOf(members []string) *hashRing {
	c.mu.Lock()
	if c.ring != nil && slices.Equal(c.members, members) {
		ring := c.ring
		c.mu.Unlock()
		return ring
	}
	c.mu.Unlock()
	ring := &hashRing{
		points: make([]uint64, 0, len(members)*c.vnodes),
		owner:  make(map[uint64]int, len(members)*c.vnodes),
	}
	var key []byte
	for m, name := range members {
		for v := range c.vnodes {
			key = append(append(append(key[:0], name...), '#'), strconv.Itoa(v)...)
			h := ringHash(key)
			if _, taken := ring.owner[h]; !taken { // a collision: the first member keeps it
				ring.owner[h] = m
				ring.points = append(ring.points, h)
			}
		}
	}
	slices.Sort(ring.points)
	c.mu.Lock()
	c.members, c.ring = slices.Clone(members), ring
	c.mu.Unlock()
	return ring
}

// ringHash is 64-bit FNV-1a followed by MurmurHash3's fmix64.
func ringHash(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// AllocateByConfig returns an allocator that gives its member the listed
// queues, whatever the group's size: RocketMQ's
// AllocateMessageQueueByConfig, for deployments where each process is told
// which queues it consumes. Unlike RocketMQ's, it returns only the listed
// queues that are offered (so a queue of another topic, or beyond a
// topic's queue count, is never claimed), in sorted order without
// duplicates, and nothing to a self that is not a member.
//
// Each member must be configured with its own list: the lists of all
// members must cover every queue exactly once, or queues go unconsumed or
// are claimed twice, and the broker reports the split as broken. The
// allocator cannot check this, as every member knows only its own list.
func AllocateByConfig(queues ...QueueID) Allocator {
	list := slices.Clone(queues)
	slices.SortFunc(list, QueueID.Compare)
	list = slices.Compact(list)
	return AllocatorFunc(func(_, self string, offered []QueueID, members []string) []QueueID {
		if memberIndex(self, members) < 0 {
			return nil
		}
		var out []QueueID
		for _, q := range list {
			if _, ok := slices.BinarySearchFunc(offered, q, QueueID.Compare); ok {
				out = append(out, q)
			}
		}
		return out
	})
}
