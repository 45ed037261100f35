package ferry

import (
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Router picks the queue a message goes to.
//
// Select returns a queue index in [0, meta.Queues). It is called for every
// message, from many goroutines at once, so it must be safe for concurrent
// use and should not block. The producer checks the result: an error or an
// index out of range fails the send with [ErrInvalidRoute] naming the
// router, and nothing is written.
//
// Router is a building block (see the package doc): it routes a foreign
// system's records as well as Ferry's messages (see the example).
type Router interface {
	Select(m *EnhancedMessage, meta TopicMeta) (int, error)
}

// RouterFunc adapts a function to a [Router].
type RouterFunc func(m *EnhancedMessage, meta TopicMeta) (int, error)

// Select calls f(m, meta).
func (f RouterFunc) Select(m *EnhancedMessage, meta TopicMeta) (int, error) { return f(m, meta) }

// KeyHashRouter returns the default router. A message with a non-empty Key
// goes to queue (murmur2(key) & 0x7fffffff) % meta.Queues, exactly the
// partition Kafka's Java default partitioner picks for the same key bytes
// and partition count, so keyed data can move between Ferry and Kafka
// without reshuffling.
//
// Messages without a Key are spread round robin in runs, as Kafka's
// sticky partitioner spreads records without a key: consecutive keyless
// messages stick to one queue for up to [DefaultStickyRun] messages (see
// [WithStickyRun]), then move to the next queue. A run also ends when no
// keyless message came for [DefaultStickyGap] (see [WithStickyGap]; by
// BornTime), so a producer that sends now and then goes
// round robin message by message, while one that sends fast hands each
// queue runs of messages its consumer reads and handles in batches. Every
// queue gets the same share over StickyRun × Queues messages. Each router
// starts one run further than the one made before it, so producers
// sending at the same pace fill different queues.
func KeyHashRouter(opts ...KeyHashOption) Router {
	r := &keyHashRouter{run: DefaultStickyRun, gap: int64(DefaultStickyGap)}
	for _, o := range opts {
		if o != nil {
			o(r)
		}
	}
	r.touch = r.gap / 10
	r.n.Store(routerSeq.Add(1) * r.run)
	return r
}

// KeyHashOption configures a [KeyHashRouter].
type KeyHashOption func(*keyHashRouter)

// WithStickyRun sets the most consecutive keyless messages the router
// sends to one queue; 1 (or less) is strict round robin. Default:
// [DefaultStickyRun].
func WithStickyRun(n int) KeyHashOption {
	return func(r *keyHashRouter) { r.run = uint64(max(1, n)) }
}

// WithStickyGap sets the pause between keyless messages after which the
// router moves to the next queue; 0 (or less) never cuts a run for a
// pause. Default: [DefaultStickyGap].
func WithStickyGap(d time.Duration) KeyHashOption {
	return func(r *keyHashRouter) { r.gap = int64(max(0, d)) }
}

// DefaultStickyRun is the most consecutive keyless messages
// [KeyHashRouter] sends to one queue by default.
const DefaultStickyRun = 64

// DefaultStickyGap is the pause between keyless messages after which
// [KeyHashRouter] moves to the next queue by default.
const DefaultStickyGap = time.Millisecond

// routerSeq numbers the KeyHashRouters of the process.
var routerSeq atomic.Uint64

type keyHashRouter struct {
	run   uint64        // the run length
	gap   int64         // the pause that cuts a run (ns); 0: none
	touch int64         // how stale last may get: a tenth of the gap
	n     atomic.Uint64 // keyless messages routed, plus the skips of runs cut short
	last  atomic.Int64  // BornTime (Unix ns) of a recent keyless message
}

func (r *keyHashRouter) Select(m *EnhancedMessage, meta TopicMeta) (int, error) {
	if m.Key != "" {
		return int(uint32(Murmur2(m.Key))&0x7fffffff) % meta.Queues, nil
	}
	if meta.Queues == 1 {
		return 0, nil
	}
	if r.gap > 0 {
		born := m.BornUnixNano
		if last := r.last.Load(); born-last > r.touch {
			// last is refreshed only every touch, so that routing a
			// message writes no shared memory but the counter.
			r.last.Store(born)
			if born-last > r.gap {
				// The run ends; one that is already full (or not
				// started) has ended, and moving on again would
				// skip a queue.
				if n := r.n.Load(); n%r.run != 0 {
					r.n.CompareAndSwap(n, (n/r.run+1)*r.run)
				}
			}
		}
	}
	return int((r.n.Add(1) - 1) / r.run % uint64(meta.Queues)), nil
}

// RoundRobinRouter returns a router that spreads messages over the queues
// in turn, with one counter shared by all topics.
func RoundRobinRouter() Router { return &roundRobinRouter{} }

type roundRobinRouter struct{ n atomic.Uint64 }

func (r *roundRobinRouter) Select(_ *EnhancedMessage, meta TopicMeta) (int, error) {
	if meta.Queues == 1 {
		return 0, nil // skips the shared atomic add and a 64-bit division
	}
	return int((r.n.Add(1) - 1) % uint64(meta.Queues)), nil
}

// RandomRouter returns a router that picks a queue uniformly at random.
func RandomRouter() Router {
	return RouterFunc(func(_ *EnhancedMessage, meta TopicMeta) (int, error) {
		return rand.IntN(meta.Queues), nil
	})
}

// ManualRouter returns a router that sends every message to the given
// queue; a topic with fewer queues fails the send with [ErrInvalidRoute].
func ManualRouter(queue int) Router {
	return RouterFunc(func(_ *EnhancedMessage, _ TopicMeta) (int, error) {
		return queue, nil
	})
}

// Murmur2 returns Kafka's murmur2 hash of the bytes of key (seed
// 0x9747b28c), as org.apache.kafka.common.utils.Utils.murmur2 computes it.
func Murmur2(key string) int32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	n := len(key)
	h := uint32(seed) ^ uint32(n)
	i := 0
	for ; i+4 <= n; i += 4 {
		k := uint32(key[i]) | uint32(key[i+1])<<8 | uint32(key[i+2])<<16 | uint32(key[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch n - i {
	case 3:
		h ^= uint32(key[i+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(key[i+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(key[i])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}
