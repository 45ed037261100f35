package ferry

import "fmt"

// The producer's side of deduplication keys (see Message.DedupKey).

// sentResult is the result of em, written alone by a write that returned
// first: a duplicate (see [Duplicates]) if its offset is not first.
func sentResult(em *EnhancedMessage, first int64) SendResult {
	id := QueueID{Topic: em.Topic, Queue: em.Queue}
	return SendResult{ID: em.ID, Queue: id, Offset: em.Offset, Target: id, Duplicate: em.Offset != first}
}

// markDuplicates sets Duplicate on the results of the messages of msgs,
// written by a write that returned first, that were not stored; res(i)
// is the result of msgs[i].
func markDuplicates(first int64, msgs []*EnhancedMessage, res func(i int) *SendResult) {
	Duplicates(first, msgs, func(i int) { res(i).Duplicate = true })
}

// checkDedup refuses a DedupKey that cannot be honoured: too long, on a
// delayed message (not deduplicated yet), or bound for a queue that does
// not deduplicate (a key the storage ignores would store a retried Send
// twice, silently).
func (p *Producer) checkDedup(m *Message, q Queue) error {
	if len(m.DedupKey) > MaxDedupKeyLen {
		return fmt.Errorf("%w: dedup key of %d bytes, limit %d", ErrInvalidMessage, len(m.DedupKey), MaxDedupKeyLen)
	}
	if p.delayed(m) {
		return fmt.Errorf("%w: a delayed message cannot have a dedup key yet", ErrInvalidMessage)
	}
	if _, ok := q.(Deduplicator); !ok {
		return fmt.Errorf("%w: dedup key for queue %s of %T, which does not deduplicate", ErrInvalidMessage, q.ID(), q)
	}
	return nil
}
