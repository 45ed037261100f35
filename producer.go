package ferry

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// DefaultMaxMessageBytes is the default bound on [Message.Size] (4 MiB,
// RocketMQ's).
const DefaultMaxMessageBytes = 4 << 20

// Producer sends messages to the broker's topics: it stamps each message
// (ID, born time, [Origin]), routes it to a queue and writes it.
//
// A Producer is safe for concurrent use. Send takes no broker-wide lock,
// only the target queue's. Only [Producer.SendAsync] starts goroutines:
// one per queue while its asynchronous sends are being written, exiting
// when none is left; Close waits for them.
type Producer struct {
	b      *Broker
	router Router
	name   string
	origin *Origin // stamped on every message: one pointer, shared
	max    int
	hooks  *hookSet // nil: none
	system bool     // writes system topics (the library's producers only)
	closed atomic.Bool
	// sent and failed count messages, for Stats.
	sent, failed atomic.Uint64
	// last is the topic of the latest send: topics are never removed and
	// a topicState never changes, so a send to the same topic skips the
	// broker's map lookup.
	last atomic.Pointer[topicState]
	// slab hands Send its envelopes (see envSlab).
	slab atomic.Pointer[envSlab]

	// Asynchronous sends (async.go). slots holds one token per send not
	// yet reported (the in-flight bound); outstanding counts sends whose
	// callbacks have not returned; wg counts the pipes' goroutines.
	slots       chan struct{}
	outstanding atomic.Int64
	waiters     atomic.Int32  // Flush and Close calls waiting for outstanding to reach 0
	closing     chan struct{} // closed by Close: waits for a slot end
	closeOnce   sync.Once
	wg          sync.WaitGroup
	lastPipe    atomic.Pointer[pipe] // the latest pipe used, to skip the map
	// amu guards pipes and idle.
	amu   sync.Mutex
	pipes map[Queue]*pipe // by target queue; the delay pipe under nil
	idle  chan struct{}   // closed when outstanding reaches 0; nil while no one waits
}

// envSlab is a block of envelopes a producer's Sends take one by one:
// one allocation per slabSize messages instead of one each, and
// neighbours in memory for a consumer reading them in order. A message
// kept (by a backlog, a handler holding it) keeps its slab, the envelopes
// of up to slabSize-1 other messages the producer sent about then: at
// most 8 KB per kept message, and nothing more once the others are gone
// too. A slab also holds the ID counter values of its envelopes, reserved
// at once: a Send takes its envelope and its ID with one atomic add on
// the producer's slab, not a second one on the counter every producer of
// the process shares.
type envSlab struct {
	next atomic.Int32
	ids  uint64 // the ID counter value of ms[0]; ms[i] has ids+i
	ms   [slabSize]EnhancedMessage
}

// slabSize fills the runtime's 8 KB size class: 51 envelopes, with the
// counters and the 8-byte header the runtime puts on objects that hold
// pointers.
const slabSize = int32((8192 - 24) / unsafe.Sizeof(EnhancedMessage{}))

// envelope returns a zeroed envelope from the producer's slab and the ID
// counter value reserved for it.
func (p *Producer) envelope() (*EnhancedMessage, uint64) { return takeEnvelope(&p.slab) }

// takeEnvelope returns a zeroed envelope from *slab, which it fills
// when it is used up, and the ID counter value reserved for it.
func takeEnvelope(slab *atomic.Pointer[envSlab]) (*EnhancedMessage, uint64) {
	for {
		s := slab.Load()
		if s != nil {
			if i := s.next.Add(1) - 1; i < slabSize {
				return &s.ms[i], s.ids + uint64(i)
			}
		}
		fresh := &envSlab{ids: reserveIDs(int(slabSize))}
		slab.CompareAndSwap(s, fresh) // a racing Send may have put one: use it
	}
}

// SendResult says where a message landed.
type SendResult struct {
	ID MessageID
	// Queue and Offset are where the message was written: its topic's
	// queue, or for a delayed message the delay queue where it waits.
	Queue  QueueID
	Offset int64
	// Target is the queue consumers get the message from: Queue, or for
	// a delayed message the queue it moves to when due.
	Target QueueID
	// DeliverAt is when a delayed message is due; zero for the others.
	DeliverAt time.Time
	// Duplicate says the message was not stored: its [Message.DedupKey]
	// was stored in the queue within the topic's [TopicMeta.DedupWindow].
	// ID, Queue and Offset are then those of the first message stored
	// with the key.
	Duplicate bool
}

// ProducerOption configures a Producer.
type ProducerOption func(*producerConfig)

type producerConfig struct {
	router   Router
	name     string
	max      int
	inFlight int
	hooks    []Hook
	system   bool // may write system topics (see systemWriter)
}

// systemWriter lets a producer write system topics: the library's own
// (dead letters).
func systemWriter() ProducerOption { return func(c *producerConfig) { c.system = true } }

// WithRouter sets the router. Default: [KeyHashRouter].
func WithRouter(r Router) ProducerOption { return func(c *producerConfig) { c.router = r } }

// WithProducerName sets the name stamped on messages. Default:
// "producer-<pid>-<n>", n counting the producers of the process.
func WithProducerName(name string) ProducerOption {
	return func(c *producerConfig) { c.name = name }
}

// WithMaxMessageBytes bounds [Message.Size]; a larger message is
// [ErrMessageTooLarge]. Default: [DefaultMaxMessageBytes].
func WithMaxMessageBytes(n int) ProducerOption { return func(c *producerConfig) { c.max = n } }

var producerSeq atomic.Int64

// NewProducer returns a producer over the broker's topics. An option value
// out of range is [ErrInvalidOption].
func (b *Broker) NewProducer(opts ...ProducerOption) (*Producer, error) {
	c := producerConfig{max: DefaultMaxMessageBytes, inFlight: DefaultMaxInFlight}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.router == nil {
		c.router = KeyHashRouter()
	}
	if c.name == "" {
		c.name = "producer-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(producerSeq.Add(1), 10)
	}
	if c.max <= 0 {
		return nil, &Error{Op: "new producer", Err: fmt.Errorf("%w: max message bytes %d", ErrInvalidOption, c.max)}
	}
	if c.inFlight <= 0 {
		return nil, &Error{Op: "new producer", Err: fmt.Errorf("%w: max in flight %d", ErrInvalidOption, c.inFlight)}
	}
	if b.closed.Load() {
		return nil, &Error{Op: "new producer", Err: ErrClosed}
	}
	origin := &Origin{Producer: c.name, Host: bornAddress}
	return &Producer{
		b: b, router: c.router, name: c.name, origin: origin, max: c.max, hooks: newHookSet(b.hooks, c.hooks), system: c.system,
		slots: make(chan struct{}, c.inFlight), closing: make(chan struct{}),
	}, nil
}

// Send stamps m, routes it and writes it to its queue. It returns where m
// landed. A nil message is [ErrInvalidMessage]; a bad or unknown topic
// [ErrInvalidTopic] or [ErrTopicNotFound]; a message over the size bound
// [ErrMessageTooLarge]; a router error or bad index [ErrInvalidRoute]; after
// Close [ErrClosed]. On error nothing is written. On a topic with [Block]
// overflow Send waits for room until ctx is done. The caller must not
// modify m afterwards.
func (p *Producer) Send(ctx context.Context, m *Message) (SendResult, error) {
	if err := checkContext(ctx); err != nil {
		p.failed.Add(1)
		return SendResult{}, &Error{Op: "send", Err: err}
	}
	r, err := p.send(ctx, m, true)
	if err != nil && p.replaced(ctx, m, &err) {
		r, err = p.send(ctx, m, true)
	}
	if err != nil {
		p.failed.Add(1)
		return SendResult{}, &Error{Op: "send", Err: err}
	}
	p.sent.Add(1)
	return r, nil
}

// TrySend is Send that never waits for room: where Send would block on a
// full [Block] queue it returns [ErrQueueFull] (a queue that is not a
// [TryWriter] is written with Write).
func (p *Producer) TrySend(m *Message) (SendResult, error) {
	r, err := p.send(context.Background(), m, false)
	if err != nil && p.replaced(context.Background(), m, &err) {
		r, err = p.send(context.Background(), m, false)
	}
	if err != nil {
		p.failed.Add(1)
		return SendResult{}, &Error{Op: "try send", Err: err}
	}
	p.sent.Add(1)
	return r, nil
}

// send is Send, or TrySend when wait is false. For a MemoryQueue the
// one-message batch stays on the stack, so a send allocates nothing but
// its share of an envelope slab; other queues get a batch from the heap.
func (p *Producer) send(ctx context.Context, m *Message, wait bool) (SendResult, error) {
	if err := ctx.Err(); err != nil {
		return SendResult{}, err
	}
	em, c := p.envelope()
	now := p.b.clock.now()
	t, i, err := p.prepare(ctx, m, em, now, c)
	if err != nil {
		return SendResult{}, err
	}
	if !m.DeliverAt.IsZero() {
		if dc := (dueCheck{p: p, stamp: now}); dc.later(m) {
			// With no hook to see it, the envelope becomes the level's
			// message.
			res, err := p.b.delay.placeFrom(ctx, &placing{em: em, target: QueueID{Topic: t.meta.Name, Queue: i},
				at: m.DeliverAt, inc: t.meta.Incarnation, now: dc.guess(), own: p.hooks == nil, wait: wait})
			if p.hooks != nil {
				p.hooks.onSent(ctx, em, err)
			}
			return res, err
		}
	}
	q := t.queues[i]
	var first int64
	if mq, ok := q.(*MemoryQueue); ok {
		one := [1]*EnhancedMessage{em}
		first, err = mq.write(ctx, one[:], wait, now)
	} else if tw, ok := q.(TryWriter); ok && !wait {
		first, err = tw.TryWrite([]*EnhancedMessage{em})
	} else {
		first, err = q.Write(ctx, []*EnhancedMessage{em})
	}
	if p.hooks != nil {
		p.hooks.onSent(ctx, em, err)
	}
	if err != nil {
		return SendResult{}, err
	}
	return sentResult(em, first), nil
}

// delayed reports whether m is due later than now.
func (p *Producer) delayed(m *Message) bool {
	return !m.DeliverAt.IsZero() && m.DeliverAt.After(p.b.time.Now())
}

// writeAt writes msgs to q. A MemoryQueue takes now, the clock reading the
// messages were stamped with, as their StoreTime instead of reading the
// clock again (unless it waits for room).
func writeAt(ctx context.Context, q Queue, msgs []*EnhancedMessage, now time.Time) (int64, error) {
	if mq, ok := q.(*MemoryQueue); ok {
		return mq.write(ctx, msgs, true, now)
	}
	return q.Write(ctx, msgs)
}

// prepare checks m, stamps it into em with ID counter value c and routes
// it: em goes to queue i of t. The caller checks ctx.
func (p *Producer) prepare(ctx context.Context, m *Message, em *EnhancedMessage, now time.Time, c uint64) (t *topicState, i int, err error) {
	if t, err = p.check(m); err != nil {
		return nil, 0, err
	}
	// Field by field, not em.Message = *m: while the GC marks, a struct
	// copy takes the bulk write barrier, which walks the type's pointer
	// bitmap; and DeliverAt is not stored (it is zero on what consumers
	// get, from any storage).
	em.Topic, em.Key, em.Tag, em.Headers, em.Body = m.Topic, m.Key, m.Tag, m.Headers, m.Body
	em.DedupKey = m.DedupKey
	em.ID = messageID(now, c)
	em.BornUnixNano = now.UnixNano()
	em.Origin = p.origin
	if i, err = p.route(em, t.meta); err != nil {
		return nil, 0, err
	}
	if m.DedupKey != "" {
		if err := p.checkDedup(m, t.queues[i]); err != nil {
			return nil, 0, err
		}
	}
	if p.hooks != nil {
		em.Queue = i
		p.hooks.onSend(ctx, em)
	}
	return t, i, nil
}

func (p *Producer) check(m *Message) (*topicState, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if m == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if !p.system && IsSystemTopic(m.Topic) {
		return nil, reserved(m.Topic)
	}
	if err := checkDueTime(m.DeliverAt); err != nil {
		return nil, err
	}
	t := p.last.Load()
	if t == nil || t.meta.Name != m.Topic || t.stale.Load() || p.b.closed.Load() {
		var err error
		if t, err = p.b.topic(m.Topic); err != nil {
			return nil, err
		}
		p.last.Store(t)
	}
	if n := m.Size(); n > p.max {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, n, p.max)
	}
	return t, nil
}

// route asks the router for em's queue and checks its answer.
func (p *Producer) route(em *EnhancedMessage, meta TopicMeta) (int, error) {
	i, err := p.router.Select(em, meta)
	if err != nil {
		return 0, fmt.Errorf("%w: router %T failed: %w", ErrInvalidRoute, p.router, err)
	}
	if i < 0 || i >= meta.Queues {
		return 0, fmt.Errorf("%w: router %T picked queue %d of %d", ErrInvalidRoute, p.router, i, meta.Queues)
	}
	return i, nil
}

// SendBatch sends msgs, which may name several topics, with one Write per
// target queue; each queue's share keeps the order it has in msgs. Every
// message is checked and routed before anything is written, so bad input
// writes nothing. The results are in the order of msgs. If a Write fails,
// the messages of queues already written stay written: their results are
// filled in, the others have Offset -1, and the error says which queue
// failed. Delayed messages (see [Message.DeliverAt]) are written after
// the others, with one write per delay level.
func (p *Producer) SendBatch(ctx context.Context, msgs []*Message) ([]SendResult, error) {
	results, ems, err := p.sendBatch(ctx, msgs)
	p.recheckBatch(ctx, msgs, err)
	p.countBatch(results, len(msgs), err)
	if p.hooks != nil {
		for i := range ems {
			var werr error
			if results == nil || results[i].Offset < 0 {
				werr = err
			}
			p.hooks.onSent(ctx, &ems[i], werr)
		}
	}
	return results, err
}

// sendBatch is SendBatch; it returns the stamped messages too, for the
// hooks (nil when nothing was stamped).
func (p *Producer) sendBatch(ctx context.Context, msgs []*Message) ([]SendResult, []EnhancedMessage, error) {
	if err := checkContext(ctx); err != nil {
		return nil, nil, &Error{Op: "send batch", Err: err}
	}
	if len(msgs) == 0 {
		if p.closed.Load() {
			return nil, nil, &Error{Op: "send batch", Err: ErrClosed}
		}
		return nil, nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, &Error{Op: "send batch", Err: err}
	}
	now := p.b.clock.now()
	dc := &dueCheck{p: p, stamp: now}
	for _, m := range msgs {
		if dc.later(m) {
			return p.sendMixed(ctx, msgs, dc)
		}
	}
	ems := make([]EnhancedMessage, len(msgs))
	first := reserveIDs(len(msgs))
	type target struct {
		t      *topicState
		bucket int // first bucket of the topic
	}
	var targets []target
	var bucketOf []int // nil while every message goes to queue q0 of targets[0]
	q0, buckets := 0, 0
	for i, m := range msgs {
		t, q, err := p.prepare(ctx, m, &ems[i], now, first+uint64(i))
		if err != nil {
			return nil, ems[:i], &Error{Op: fmt.Sprintf("send batch: message %d", i), Err: err}
		}
		if i == 0 {
			targets = append(targets, target{t: t})
			buckets, q0 = t.meta.Queues, q
			continue
		}
		if bucketOf == nil && t == targets[0].t && q == q0 {
			continue
		}
		if bucketOf == nil {
			bucketOf = make([]int, len(msgs))
			for j := range i {
				bucketOf[j] = q0
			}
		}
		k := -1
		for j := range targets {
			if targets[j].t == t {
				k = j
				break
			}
		}
		if k < 0 {
			targets = append(targets, target{t: t, bucket: buckets})
			buckets += t.meta.Queues
			k = len(targets) - 1
		}
		bucketOf[i] = targets[k].bucket + q
	}
	if bucketOf == nil {
		results, err := p.writeOne(ctx, targets[0].t, q0, ems, now)
		return results, ems, err
	}
	// Counting sort by bucket keeps each queue's messages in input order.
	start := make([]int, buckets+1)
	for _, bk := range bucketOf {
		start[bk+1]++
	}
	for i := 1; i <= buckets; i++ {
		start[i] += start[i-1]
	}
	sorted := make([]*EnhancedMessage, len(msgs))
	index := make([]int, len(msgs)) // index[k]: position in msgs of sorted[k]
	pos := slices.Clone(start[:buckets])
	for i, bk := range bucketOf {
		sorted[pos[bk]] = &ems[i]
		index[pos[bk]] = i
		pos[bk]++
	}
	results := make([]SendResult, len(msgs))
	for i := range results {
		results[i].Offset = -1
	}
	for _, tg := range targets {
		for q := 0; q < tg.t.meta.Queues; q++ {
			lo, hi := start[tg.bucket+q], start[tg.bucket+q+1]
			if lo == hi {
				continue
			}
			first, err := writeAt(ctx, tg.t.queues[q], sorted[lo:hi], now)
			if err != nil {
				return results, ems, &Error{Op: fmt.Sprintf("send batch: write %s", tg.t.queues[q].ID()), Err: err}
			}
			for k := lo; k < hi; k++ {
				em := sorted[k]
				id := QueueID{Topic: em.Topic, Queue: q}
				results[index[k]] = SendResult{ID: em.ID, Queue: id, Offset: em.Offset, Target: id}
			}
			markDuplicates(first, sorted[lo:hi], func(i int) *SendResult { return &results[index[lo+i]] })
		}
	}
	return results, ems, nil
}

// sendMixed is sendBatch for a batch with delayed messages: every
// message is checked and routed before anything is written; then the
// others are written as a batch, then the delayed ones, with one write
// per delay level. dc says which are delayed, and holds the batch's
// stamp.
func (p *Producer) sendMixed(ctx context.Context, msgs []*Message, dc *dueCheck) ([]SendResult, []EnhancedMessage, error) {
	now := dc.stamp
	first := reserveIDs(len(msgs))
	ems := make([]EnhancedMessage, len(msgs))
	results := make([]SendResult, len(msgs))
	for i := range results {
		results[i].Offset = -1
	}
	var plain []*Message
	var plainAt []int
	later := make([]delayed, 0, len(msgs))
	for i, m := range msgs {
		if !dc.later(m) {
			plain = append(plain, m)
			plainAt = append(plainAt, i)
			continue
		}
		t, q, err := p.prepare(ctx, m, &ems[i], now, first+uint64(i))
		if err != nil {
			return nil, ems[:0], &Error{Op: fmt.Sprintf("send batch: message %d", i), Err: err}
		}
		// With no hook to see it, the envelope becomes the level's
		// message.
		later = append(later, delayed{em: &ems[i], target: QueueID{Topic: t.meta.Name, Queue: q}, at: m.DeliverAt,
			res: &results[i], inc: t.meta.Incarnation, own: p.hooks == nil})
	}
	for _, m := range plain { // checked before anything is written
		if _, err := p.check(m); err != nil {
			return nil, ems[:0], &Error{Op: "send batch", Err: err}
		}
	}
	if len(plain) > 0 {
		res, pems, err := p.sendBatch(ctx, plain)
		for k, i := range plainAt {
			if k < len(res) {
				results[i] = res[k]
			}
			if k < len(pems) {
				ems[i] = pems[k]
			}
		}
		if err != nil {
			return results, ems, err
		}
	}
	if err := p.b.delay.placeBatchFrom(ctx, later, dc.guess()); err != nil {
		return results, ems, &Error{Op: "send batch: delayed messages", Err: err}
	}
	return results, ems, nil
}

// writeOne writes a batch whose messages all go to queue q of t: no
// sorting, one Write.
func (p *Producer) writeOne(ctx context.Context, t *topicState, q int, ems []EnhancedMessage, now time.Time) ([]SendResult, error) {
	ptrs := make([]*EnhancedMessage, len(ems))
	for i := range ems {
		ptrs[i] = &ems[i]
	}
	results := make([]SendResult, len(ems))
	first, err := writeAt(ctx, t.queues[q], ptrs, now)
	if err != nil {
		for i := range results {
			results[i].Offset = -1
		}
		return results, &Error{Op: fmt.Sprintf("send batch: write %s", t.queues[q].ID()), Err: err}
	}
	id := QueueID{Topic: t.meta.Name, Queue: q}
	for i := range ems {
		results[i] = SendResult{ID: ems[i].ID, Queue: id, Offset: ems[i].Offset, Target: id}
	}
	markDuplicates(first, ptrs, func(i int) *SendResult { return &results[i] })
	return results, nil
}

// Name returns the name the producer stamps on messages.
func (p *Producer) Name() string { return p.name }

// Close stops the producer: later sends return [ErrClosed], and so does a
// [Producer.SendAsync] waiting for room. Sends in progress finish, and
// Close flushes: it returns once every outstanding asynchronous send is
// written (or failed) and reported, and the producer's goroutines have
// exited. Each of those writes is bounded by its sends' contexts, as a
// Send is; a write to a closed queue (its storage closed) fails with
// ErrClosed. It is
// idempotent and returns nil. It must not be called from a SendAsync
// callback.
func (p *Producer) Close() error {
	p.closed.Store(true)
	p.closeAsync()
	return nil
}
