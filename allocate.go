package ferry

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
