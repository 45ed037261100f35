package ferry

import (
	"context"
	"errors"
	"math/bits"
	"strconv"
	"time"
	"unsafe"
)

// Placing a delayed message in its level, and the level message's form.

// place writes em, stamped and routed to target, to the delay level for
// a delivery at at. wait false: a full level queue is ErrQueueFull.
func (d *delayer) place(ctx context.Context, em *EnhancedMessage, target QueueID, at time.Time, wait bool) (SendResult, error) {
	return d.placeFrom(ctx, &placing{em: em, target: target, at: at, inc: d.incarnation(target), wait: wait})
}

// placing is a message to place: em, stamped and routed to target
// (incarnation inc of its topic), due at at; wait false: a full level
// queue is ErrQueueFull. now, unless zero, is a reading of the
// delayer's clock taken just before, or a stamp (see dueCheck): the
// guess its placement time comes from (see level.placeTime). own says
// em is the caller's to reuse: it becomes the level's message instead
// of a copy (a producer's envelope no hook sees), once the message is
// known to go to a level (not delivered now).
type placing struct {
	em     *EnhancedMessage
	target QueueID
	at     time.Time
	inc    uint64
	now    time.Time
	own    bool
	wait   bool
}

// placeFrom is place for pl.
func (d *delayer) placeFrom(ctx context.Context, pl *placing) (SendResult, error) {
	res, err := d.placeAt(ctx, pl)
	if errors.Is(err, errDueNow) {
		return d.deliverNow(ctx, pl.em, pl.target, pl.at, pl.wait)
	}
	return res, err
}

// surelyLater is how much later than a stamp (see coarseClock) a due
// time must be for dueCheck to take it for later than now without
// reading the clock: far more than a stamp can be off.
const surelyLater = time.Second

// dueCheck says which messages go to a delay level (are due later than
// now), reading the broker's clock at most once: for a send, a batch.
// stamp is the stamp the messages are sent with: on the system clock a
// due time much later than it is later than now, without a read (a
// stamp can be off, but not by that much; and only a reading says a
// message is due, see level.placeTime); a read costs as much as a
// quarter of a plain Send.
type dueCheck struct {
	p     *Producer
	stamp time.Time
	at    time.Time // the clock reading, once read
}

// later reports whether m is due later than now.
func (c *dueCheck) later(m *Message) bool {
	if m == nil || m.DeliverAt.IsZero() {
		return false
	}
	if c.at.IsZero() {
		if _, sys := c.p.b.time.(systemClock); sys && m.DeliverAt.Sub(c.stamp) > surelyLater {
			return true
		}
		c.at = c.p.b.time.Now()
	}
	return m.DeliverAt.After(c.at)
}

// guess returns a reading of the broker's clock to pick the first level
// to try with (see placing): the clock read, else the stamp, which
// serves on the system clock.
func (c *dueCheck) guess() time.Time {
	if c.at.IsZero() {
		return c.stamp
	}
	return c.at
}

// errDueNow is placeAt's when at is due by the clock read under the
// level's lock: no level may hold a message that is due already (its
// level's front would not bound it, and the dispatcher could deliver a
// later one first).
var errDueNow = errors.New("due already")

// deliverNow writes em, due already, to its target.
func (d *delayer) deliverNow(ctx context.Context, em *EnhancedMessage, target QueueID, at time.Time, wait bool) (SendResult, error) {
	t, err := d.b.topic(target.Topic)
	if err != nil {
		return SendResult{}, err
	}
	q := t.queues[target.Queue%len(t.queues)]
	w := delivered(t, em, em.Tag, em.DedupKey, time.Time{})
	first, err := write(ctx, q, w, wait, time.Time{})
	if err != nil {
		return SendResult{}, err
	}
	id := QueueID{Topic: t.meta.Name, Queue: target.Queue % len(t.queues)}
	return SendResult{ID: w.ID, Queue: id, Offset: w.Offset, DeliverAt: at, Target: id, Duplicate: w.Offset != first}, nil
}

// delivered returns em as it goes to its target topic t, with the tag
// tag and the deduplication key key (a level key back as the user's, see
// userKey): without the headers of a level's
// message of an earlier version and, unless due is zero, with its due
// time in HeaderDeliverAt.
func delivered(t *topicState, em *EnhancedMessage, tag, key string, due time.Time) *EnhancedMessage {
	h := em.Headers
	if !due.IsZero() || hasDelayHeader(h) {
		h = make(map[string]string, len(em.Headers)+1)
		for k, v := range em.Headers {
			if !isDelayHeader(k) || k == HeaderDeliverAt && due.IsZero() {
				h[k] = v
			}
		}
		if !due.IsZero() {
			h[HeaderDeliverAt] = strconv.FormatInt(due.UnixNano(), 10)
		}
	}
	return &EnhancedMessage{
		Message: Message{Topic: t.meta.Name, Key: em.Key, Tag: tag, Headers: h, Body: em.Body, DedupKey: userKey(t.meta.Name, key)},
		ID:      em.ID, BornUnixNano: em.BornUnixNano, Origin: em.Origin,
	}
}

// hasDelayHeader reports whether h holds a level's own header other than
// HeaderDeliverAt.
func hasDelayHeader(h map[string]string) bool {
	for k := range h {
		if k != HeaderDeliverAt && isDelayHeader(k) {
			return true
		}
	}
	return false
}

// incarnation returns the incarnation of target's topic, for a message
// placed now (a move down keeps the one it was placed with).
func (d *delayer) incarnation(target QueueID) uint64 {
	if t, ok := d.b.lookup(target.Topic); ok {
		return t.meta.Incarnation
	}
	return 0
}

// placeAt is placeFrom, or errDueNow when pl.at is due by the clock
// read under the level's write lock (see level.placeTime; pl.em is then
// as it was).
func (d *delayer) placeAt(ctx context.Context, pl *placing) (SendResult, error) {
	em, target, at := pl.em, pl.target, pl.at
	if err := checkDueTime(at); err != nil {
		return SendResult{}, err
	}
	guess := pl.now
	if guess.IsZero() {
		guess = d.clock.Now()
	}
	n, _ := delayLevel(at.Sub(guess))
	for {
		lv, err := d.level(ctx, n)
		if err != nil {
			return SendResult{}, err
		}
		lv.wmu.Lock()
		now, err := lv.placeTime(d, guess, at)
		if err != nil {
			lv.wmu.Unlock()
			return SendResult{}, err
		}
		m, hop := delayLevel(at.Sub(now))
		if m != n {
			lv.wmu.Unlock()
			n, guess = m, now // the clock moved on meanwhile
			continue
		}
		w := em
		if !pl.own {
			w = new(EnhancedMessage)
		}
		delayedMessage(w, lv, em, target, at, now.Add(hop), pl.inc)
		first, err := write(ctx, lv.queue, w, pl.wait, d.stamp(now))
		lv.wmu.Unlock()
		if err != nil {
			return SendResult{}, err
		}
		return SendResult{ID: w.ID, Queue: QueueID{Topic: lv.t.meta.Name}, Offset: w.Offset, DeliverAt: at, Target: target, Duplicate: w.Offset != first}, nil
	}
}

// placeTime returns the time a message due at at is placed in level lv
// at, guess a reading of the delayer's clock (or a stamp, see dueCheck)
// taken before: the level and the hop come from it. It is no earlier
// than the level's floor, the time of its last message and of the last
// check that its mover had read everything (see delayer.limit): so the
// level's messages are in the order of their hops, and a write such a
// check did not see acts no earlier than the check's reading. It is
// errDueNow when at is due by a reading of the clock under lv.wmu (held):
// no level may hold a message that is due by a check's reading (its
// front would not bound it, and the dispatcher could deliver a later one
// first), and only a reading says a message is due (a stamp can be
// ahead of the clock: never early). A message due by the time returned
// but not by the clock goes to level 0, which acts at its due time; one
// due by the clock but not by the time (an old guess) is delivered at
// once by the dispatcher. One clock read less per delayed send: it costs
// as much as a quarter of a plain Send.
func (lv *level) placeTime(d *delayer, guess, at time.Time) (time.Time, error) {
	now := guess
	if lv.floor.After(now) {
		now = lv.floor
	}
	if !at.After(now) {
		if !at.After(d.clock.Now()) {
			return time.Time{}, errDueNow
		}
	}
	lv.floor = now
	return now, nil
}

// tagBlock is the size of the blocks a level cuts its messages' tags
// from (see delayedMessage).
const tagBlock = 4096

// delayedMessage makes w (which may be em) em as level lv stores it:
// bound for target (incarnation inc of its topic) at at, its hop ending
// at hop; and returns it. The caller holds lv.wmu. The tag is cut from
// the level's current block of tags (a new one when it is full): one
// allocation for the tags of the many messages placed about the same
// time, which wait in the level together and move at about the same
// time (a message kept keeps its block).
func delayedMessage(w *EnhancedMessage, lv *level, em *EnhancedMessage, target QueueID, at, hop time.Time, inc uint64) *EnhancedMessage {
	// Written in place: the block's bytes up to len(lv.tags) are never
	// written again.
	if room := 5*20 + len(target.Topic) + len(em.Tag); room > tagBlock/8 {
		fillDelayed(w, lv, em, string(appendDelayTag(nil, em, target, at, hop, inc)), target.Topic)
		return w
	} else if cap(lv.tags)-len(lv.tags) < room {
		lv.tags = make([]byte, 0, tagBlock)
	}
	start := len(lv.tags)
	lv.tags = lv.appendTag(lv.tags, em, target, at, hop, inc)
	fillDelayed(w, lv, em, unsafe.String(&lv.tags[start], len(lv.tags)-start), target.Topic)
	return w
}

// delayed is a message for placeBatch: stamped, routed to target
// (incarnation inc of its topic), due at at; res is filled in once it is
// written. own: em is the caller's to reuse (see placing).
type delayed struct {
	em     *EnhancedMessage
	target QueueID
	at     time.Time
	res    *SendResult
	inc    uint64
	own    bool
}

// placeBatch is place for several messages, with one write per level
// (in their order within it); a message whose level changes between the
// two clock readings is placed alone. On error, the messages of the
// levels written before stay written (their results filled in).
func (d *delayer) placeBatch(ctx context.Context, ms []delayed) error {
	for i := range ms {
		ms[i].inc = d.incarnation(ms[i].target)
	}
	return d.placeBatchFrom(ctx, ms, time.Time{})
}

// placeBatchFrom is placeBatch for messages whose inc is set; guess,
// unless zero, is a reading of the delayer's clock taken just before
// (see placing).
func (d *delayer) placeBatchFrom(ctx context.Context, ms []delayed, guess time.Time) error {
	if guess.IsZero() {
		guess = d.clock.Now()
	}
	room := 0 // the tags' length, at most (a hop ends before its due time)
	for _, m := range ms {
		if err := checkDueTime(m.at); err != nil {
			return err
		}
		room += 2*decimalLen(uint64(max(0, m.at.UnixNano()))) + decimalLen(uint64(max(0, m.target.Queue))) + decimalLen(m.inc) +
			len(m.target.Topic) + len(m.em.Tag) + 5
	}
	// Each message's level, and the levels there are (most batches have
	// one): messages are taken per level in their order.
	levels := make([]uint8, len(ms))
	var present uint32
	for i, m := range ms {
		n, _ := delayLevel(m.at.Sub(guess))
		levels[i] = uint8(n)
		present |= 1 << n
	}
	batch := make([]*EnhancedMessage, 0, len(ms))
	placed := make([]int, 0, len(ms)) // the index in ms of each of batch's messages
	var alone []int
	var tags []byte                 // placed's tags, one after another
	ends := make([]int, 0, len(ms)) // where each of them ends in tags
	for ; present != 0; present &= present - 1 {
		n := bits.TrailingZeros32(present)
		lv, err := d.level(ctx, n)
		if err != nil {
			return err
		}
		batch, placed, alone, ends = batch[:0], placed[:0], alone[:0], ends[:0]
		var first int64
		lv.wmu.Lock()
		now := guess // see level.placeTime
		if lv.floor.After(now) {
			now = lv.floor
		}
		lv.floor = now
		// The level's messages come from one slab, their tags from one
		// string (they move at about the same time, and go together).
		if tags == nil {
			tags = make([]byte, 0, room)
		}
		for i, m := range ms {
			if int(levels[i]) != n {
				continue
			}
			k, hop := delayLevel(m.at.Sub(now))
			if k != n || !m.at.After(now) {
				// Its level changed, or it may be due already (see
				// level.placeTime): placed alone.
				alone = append(alone, i)
				continue
			}
			tags = lv.appendTag(tags, m.em, m.target, m.at, now.Add(hop), m.inc)
			ends = append(ends, len(tags))
			placed = append(placed, i)
		}
		if len(placed) > 0 {
			var slab []EnhancedMessage // for the messages not the caller's to reuse
			// The tags' bytes are not written again (tags starts
			// anew for the next level); room is their length, but for
			// a digit here and there.
			all := unsafe.String(&tags[0], len(tags))
			tags = nil
			start := 0
			for k, i := range placed {
				w := ms[i].em
				if !ms[i].own {
					if slab == nil {
						slab = make([]EnhancedMessage, len(placed)-k)
					}
					w, slab = &slab[0], slab[1:]
				}
				fillDelayed(w, lv, ms[i].em, all[start:ends[k]], ms[i].target.Topic)
				start = ends[k]
				batch = append(batch, w)
			}
			first, err = writeAt(ctx, lv.queue, batch, d.stamp(now))
		}
		lv.wmu.Unlock()
		if err != nil {
			return err
		}
		for k, i := range placed {
			w := batch[k]
			*ms[i].res = SendResult{ID: w.ID, Queue: QueueID{Topic: lv.t.meta.Name}, Offset: w.Offset, DeliverAt: ms[i].at, Target: ms[i].target}
		}
		Duplicates(first, batch, func(k int) { ms[placed[k]].res.Duplicate = true })
		for _, i := range alone {
			m := ms[i]
			res, err := d.placeFrom(ctx, &placing{em: m.em, target: m.target, at: m.at, inc: m.inc, own: m.own, wait: true})
			if err != nil {
				return err
			}
			*ms[i].res = res
		}
	}
	return nil
}

// decimalLen returns how many digits u has in decimal.
func decimalLen(u uint64) int {
	n := 1
	for p := uint64(10); n < 20 && u >= p; p *= 10 {
		n++
	}
	return n
}

// appendDelayTag appends to b the tag of em as a level stores it: bound
// for target (incarnation inc of its topic) at at, its hop ending at hop.
func appendDelayTag(b []byte, em *EnhancedMessage, target QueueID, at, hop time.Time, inc uint64) []byte {
	b = appendDelayTimes(b, at, hop)
	b = appendDelayTarget(b, target, inc)
	return append(b, em.Tag...)
}

// appendDelayTimes appends the head of a level's tag: its due time and
// the end of its hop.
func appendDelayTimes(b []byte, at, hop time.Time) []byte {
	b = strconv.AppendInt(b, at.UnixNano(), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, hop.UnixNano(), 10)
	return append(b, ',')
}

// appendDelayTarget appends the middle of a level's tag: its target
// queue, its incarnation and its topic, up to the '|'.
func appendDelayTarget(b []byte, target QueueID, inc uint64) []byte {
	b = strconv.AppendInt(b, int64(target.Queue), 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, inc, 10)
	b = append(b, ',')
	b = append(b, target.Topic...)
	return append(b, '|')
}

// appendTag is appendDelayTag, with the middle of the last tag the level
// made kept for the next (most go to the same target). The caller holds
// lv.wmu.
func (lv *level) appendTag(b []byte, em *EnhancedMessage, target QueueID, at, hop time.Time, inc uint64) []byte {
	b = appendDelayTimes(b, at, hop)
	if lv.target.text == nil || lv.target.id != target || lv.target.inc != inc {
		lv.target.id, lv.target.inc = target, inc
		lv.target.text = appendDelayTarget(lv.target.text[:0], target, inc)
	}
	b = append(b, lv.target.text...)
	return append(b, em.Tag...)
}

// fillDelayed makes w em as level lv stores it, with the tag tag, bound
// for topic target (w may be em): a user's DedupKey becomes its level
// key (see levelKey). It shares em's headers (messages are not modified
// once sent), unless they are those of a level's message of an earlier
// version.
func fillDelayed(w *EnhancedMessage, lv *level, em *EnhancedMessage, tag, target string) {
	h := em.Headers
	if hasDelayHeader(h) {
		h = make(map[string]string, len(em.Headers))
		for k, v := range em.Headers {
			if !isDelayHeader(k) {
				h[k] = v
			}
		}
	}
	// Field by field (see Producer.prepare), which also lets w be em.
	w.Topic, w.Key, w.Tag, w.Headers, w.Body, w.DedupKey = lv.t.meta.Name, em.Key, tag, h, em.Body, levelKey(target, em.DedupKey)
	w.DeliverAt = time.Time{}
	w.ID, w.BornUnixNano, w.Origin = em.ID, em.BornUnixNano, em.Origin
	w.Queue, w.Offset, w.StoreUnixNano = 0, 0, 0
}

// moveKey is the deduplication key of the moves of a (the hops down the
// levels and the delivery to its target): the key a's message carries,
// else one derived from where it waits. Every move of a message keeps
// the key it got at its first, so that a move replayed after a crash or
// a restart (its level's cursor not committed yet) is not stored again,
// wherever it goes (see [Deduplicator]; a store that does not
// deduplicate stores it again): the replay reads the clock anew and may
// take the message to another level than the first time did, or, due
// by then, straight to its target, and the two copies meet under one key
// at the target at the latest. A message placed with a key of its own (a
// retry's, derived from the position and attempt of the message it
// retries) keeps that key: a retry written again after a crash (the
// handler attempted again, the same attempt) takes another path through
// the levels and still reaches the retry topic once.
func moveKey(a *delayAction) string {
	if a.msg.DedupKey != "" {
		return a.msg.DedupKey
	}
	return "%move:" + a.lv.t.meta.Name + ":" + strconv.FormatInt(a.msg.Offset, 10)
}

// stamp returns now, a reading of the delayer's clock, as a time to
// stamp a stored message with (see MemoryQueue.write): on the system
// clock now itself, which saves a clock read; on another clock zero (the
// queue reads the system clock).
func (d *delayer) stamp(now time.Time) time.Time {
	if _, sys := d.clock.(systemClock); sys {
		return now
	}
	return time.Time{}
}

// write writes one message to q and returns the offset the write
// returned (not m's when m was a duplicate, see [Duplicates]); wait
// false uses TryWrite where q has it. now, unless zero, is a reading of
// the system clock taken just before, for a MemoryQueue to stamp m with
// (see MemoryQueue.write).
func write(ctx context.Context, q Queue, m *EnhancedMessage, wait bool, now time.Time) (int64, error) {
	if mq, ok := q.(*MemoryQueue); ok { // the batch stays on the stack
		one := [1]*EnhancedMessage{m}
		return mq.write(ctx, one[:], wait, now)
	}
	one := []*EnhancedMessage{m}
	if tw, ok := q.(TryWriter); ok && !wait {
		return tw.TryWrite(one)
	}
	return q.Write(ctx, one)
}
