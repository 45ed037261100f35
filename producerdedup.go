package ferry

import (
	"fmt"
	"strings"
)

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

// checkDedup refuses a DedupKey that cannot be honoured: too long, one
// of the library's own (see systemKeyPrefix), or bound for a queue that
// does not deduplicate (a key the storage ignores would store a retried
// Send twice, silently).
func (p *Producer) checkDedup(m *Message, q Queue) error {
	if len(m.DedupKey) > MaxDedupKeyLen {
		return fmt.Errorf("%w: dedup key of %d bytes, limit %d", ErrInvalidMessage, len(m.DedupKey), MaxDedupKeyLen)
	}
	if !p.system && strings.HasPrefix(m.DedupKey, systemKeyPrefix) {
		return fmt.Errorf("%w: dedup key %q: keys starting with %q are the library's (its moves between topics)", ErrInvalidMessage, clip(m.DedupKey, 64), systemKeyPrefix)
	}
	if _, ok := q.(Deduplicator); !ok {
		return fmt.Errorf("%w: dedup key for queue %s of %T, which does not deduplicate", ErrInvalidMessage, q.ID(), q)
	}
	return nil
}

// systemKeyPrefix starts every deduplication key the library makes for
// its own writes (a delay's moves, a retry, a dead letter, a
// transaction's outputs), and no user's: a user's key never meets one.
const systemKeyPrefix = "%"

// levelKeyPrefix starts the key a delayed message with a user's DedupKey
// waits in its delay level under: the levels are shared by every topic,
// so the key there names its target topic too ("%at:<topic>:<key>"). It
// goes back to the user's key when the message is delivered (see
// userKey): the delivery is checked against what its topic stored.
const levelKeyPrefix = systemKeyPrefix + "at:"

// levelKey returns the key em, bound for topic, waits in a delay level
// under: a user's key in the level's namespace; the library's own keys
// (a retry's) are unique across topics already.
func levelKey(topic, key string) string {
	if key == "" || strings.HasPrefix(key, systemKeyPrefix) {
		return key
	}
	return levelKeyPrefix + topic + ":" + key
}

// userKey returns the key a message waiting under key in a delay level
// is delivered to topic with: the user's key, for a levelKey.
func userKey(topic, key string) string {
	if rest, ok := strings.CutPrefix(key, levelKeyPrefix); ok {
		if k, ok := strings.CutPrefix(rest, topic+":"); ok {
			return k
		}
	}
	return key
}
