package ferry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Delayed delivery. A message sent with a DeliverAt in the future waits in
// a delay level: an ordinary topic of one queue, "%DELAY%<n>" for n from 0
// to delayLevels-1, written like any other, so it is as durable as the
// storage. Level n ≥ 1 takes messages with between delayWindow·2ⁿ and
// delayWindow·2ⁿ⁺¹ to wait, and keeps each for delayWindow·2ⁿ (its hop),
// a constant per level, so every level is FIFO in the time its hop ends;
// level 0 takes those with less than two windows to wait (no hop). When
// its hop ends a message has less than half its wait left: it moves down
// to a lower level (a write), or, with less than two windows left, is
// delivered to its topic when due. A wait of days takes about twenty
// hops, spread over the wait.
//
// One broker moves every level (over a shared storage and coordinator,
// one in all the brokers: it holds the delay lock, level 0's lock in
// group delayGroup, and makes the levels that do not exist yet before it
// moves any). A mover per level reads its level in order and hands each
// message to the broker's dispatcher delayWindow before its hop ends; it
// reads no further while the next message is not that near, so memory
// holds only messages due within a few windows, however many wait, and no
// timer per message. The dispatcher, one goroutine, carries out what falls
// due in the order of due times, and no further than every level's front
// (the earliest time a message it has not handed over yet can act at), so
// a key's messages with ordered due times arrive in that order even when a
// mover lags, whichever broker placed them: the whole path a message can
// take, every level down to its target, is one owner's. The others wait
// for the lock, each broker over a shared storage as soon as a level
// exists (see discovering); the one that takes it when the owner closes or
// dies reads on from the levels' committed cursors. A level's message is
// finished once it moved, and its cursor committed after that: a crash in
// between moves it again (at least once, under the key of its first move:
// see moveKey); the delay lock's fencing token fences every level's
// cursor. Nothing is delivered before its time on the broker's clock.
//
// One owner for all the levels, not one per level (as before): with a
// level's lock in one broker and the next level's in another, each
// dispatcher bounded by the fronts of its own levels only, a lagging
// broker held a key's message due at T in its level while another
// delivered the key's message due at T+1 ms from its own (issue 27
// defect 6).
const (
	delayTopicPrefix = "%DELAY%"
	delayGroup       = "ferry-delay"
	// delayWindow is the shortest hop, and how long before its time an
	// action enters the dispatcher's heap.
	delayWindow = 50 * time.Millisecond
	// delayLevels counts the levels: the longest hop, delayWindow·2³¹,
	// is about three years.
	delayLevels = 32
)

// HeaderDeliverAt is on a delayed message delivered to its topic: when it
// was due, in Unix nanoseconds.
const HeaderDeliverAt = "ferry-deliver-at"

// A level's message says what its move is in its Tag, ahead of the
// message's own tag (one string to make per message, and no headers map
// of its own: it shares the message's): "<due>,<hop>,<queue>,
// <incarnation>,<topic>|<tag>", its due time and the end of its hop in
// Unix nanoseconds, its target queue, the incarnation of its target topic
// when it was placed (see TopicMeta.Incarnation: a message bound for a
// topic deleted and created again since is dropped, not delivered to the
// new one; 0: none), its target topic (a topic name holds no '|'), then
// the tag it is delivered with. No consumer of a level filters by tag.
//
// Earlier versions said it in headers, which a level's message stored
// then still has (read as before): its target topic and queue, the end
// of its hop, its target's incarnation, and its due time in
// HeaderDeliverAt.
const (
	headerDelayTopic       = "ferry-delay-topic"
	headerDelayQueue       = "ferry-delay-queue"
	headerDelayHop         = "ferry-delay-hop"
	headerDelayIncarnation = "ferry-delay-incarnation"
)

// isDelayHeader reports whether k is one of the headers a level's message
// had in earlier versions, which a message moved or delivered goes
// without (HeaderDeliverAt is set again on delivery).
func isDelayHeader(k string) bool {
	switch k {
	case HeaderDeliverAt, headerDelayTopic, headerDelayQueue, headerDelayHop, headerDelayIncarnation:
		return true
	}
	return false
}

// IsDelayTopic reports whether name is one of the internal topics where
// delayed messages wait.
func IsDelayTopic(name string) bool { return strings.HasPrefix(name, delayTopicPrefix) }

func delayTopic(n int) string { return delayTopicPrefix + strconv.Itoa(n) }

// delayLevelOf returns the level of a delay topic's name.
func delayLevelOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, delayTopicPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= delayLevels || delayTopic(n) != name {
		return 0, false
	}
	return n, true
}

// delayLevel returns the level for a wait of r, and the hop there:
// level 0 (no hop) below two windows, else the longest hop of
// delayWindow·2ⁿ no longer than r.
func delayLevel(r time.Duration) (int, time.Duration) {
	if r < 2*delayWindow {
		return 0, 0
	}
	n := min(bits.Len64(uint64(r/delayWindow))-1, delayLevels-1)
	return n, delayWindow << n
}

// delayer moves the broker's delayed messages; see above.
type delayer struct {
	b      *Broker
	clock  Clock
	member string // its member ID in the delay lock's group
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}

	mu      sync.Mutex // guards the fields below and those of the levels marked so
	closed  bool
	serving bool // serve (for the delay lock), the dispatcher and the committer run
	levels  [delayLevels]*level
	// open is levels, for a send to read without the lock (a level is
	// never closed before the delayer).
	open [delayLevels]atomic.Pointer[level]
	due  actionHeap
	seq  uint64
	// parked holds, per target queue, the due actions that wait for it
	// (a full Block queue, a failing write), in order: a target that
	// cannot take a message waits alone, and its later actions wait
	// behind it so that their order holds.
	parked map[QueueID]*parkedTarget
}

// parkedTarget is a target queue's actions waiting for it to take the
// first one, tried again at retry (on the system clock).
type parkedTarget struct {
	acts  []*delayAction
	retry time.Time
}

// level is a delay level and its mover's state.
type level struct {
	n     int
	t     *topicState
	queue Queue
	// wmu is held by a write to the level around its placement time (see
	// level.placeTime), and by a check that the mover has read
	// everything: a write is then either seen by the check or placed no
	// earlier than its reading.
	wmu sync.Mutex
	// floor is under wmu: no earlier than the placement time of the
	// level's last message and the reading of the last such check.
	floor time.Time
	tags  []byte // under wmu: the block the level's tags are cut from (see delayedMessage)
	// Under wmu: the target of the last message written, and the middle
	// of its tag (see level.appendTag).
	target struct {
		id   QueueID
		inc  uint64
		text []byte
	}

	// Under delayer.mu:
	owned bool   // this broker holds the delay lock and moves the level
	epoch uint64 // counts ownerships: an action of an older one is dropped
	token uint64 // the delay lock's fencing token
	read  int64  // the next offset to read
	// front is no later than the action time of any message of the level
	// not yet handed to the dispatcher (while owned).
	front time.Time
	idle  bool // everything read was handed over; the mover waits for more
	// The offsets handed over from base on, and which are done: the
	// cursor can move to base.
	base      int64
	done      []bool
	committed int64
}

// delayAction is a message of a level, handed to the dispatcher.
type delayAction struct {
	at        time.Time // when to act
	hop       time.Time // when its hop ends
	seq       uint64
	deliverAt time.Time
	target    QueueID
	inc       uint64           // the target topic's incarnation, 0 if none
	tag       string           // the tag it is delivered with
	msg       *EnhancedMessage // as stored in the level
	lv        *level
	epoch     uint64
}

func newDelayer(b *Broker, clock Clock) *delayer {
	d := &delayer{b: b, clock: clock, wake: make(chan struct{}, 1),
		member: "delay-" + bornAddress + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(memberSeq.Add(1), 10)}
	d.ctx, d.stop = context.WithCancel(context.Background())
	return d
}

// MaxDeliverAt is the latest due time a delayed message can have (see
// [Message.DeliverAt]): due times are stored as Unix nanoseconds, which
// end in April 2262. A later one is [ErrInvalidMessage], never moved.
var MaxDeliverAt = time.Unix(0, math.MaxInt64)

// checkDueTime refuses a due time later than MaxDeliverAt.
func checkDueTime(at time.Time) error {
	if at.After(MaxDeliverAt) {
		return fmt.Errorf("%w: due time %s is after %s, the latest a due time can be", ErrInvalidMessage, at.UTC().Format(time.RFC3339), MaxDeliverAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// level returns level n, creating its topic if needed, and makes sure
// this broker serves the delays.
func (d *delayer) level(ctx context.Context, n int) (*level, error) {
	if lv := d.open[n].Load(); lv != nil {
		return lv, nil
	}
	name := delayTopic(n)
	if _, err := d.b.topic(name); errors.Is(err, ErrTopicNotFound) {
		if err := d.b.createSystemTopic(ctx, TopicMeta{Name: name, Queues: 1}); err != nil {
			return nil, err
		}
	}
	return d.run(n)
}

// run opens level n, whose topic exists, unless it is open, and makes
// sure this broker serves the delays (unless it closed).
func (d *delayer) run(n int) (*level, error) {
	t, err := d.b.topic(delayTopic(n))
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	lv := d.levels[n]
	if lv == nil {
		lv = &level{n: n, t: t, queue: t.queues[0]}
		d.levels[n] = lv
		d.open[n].Store(lv)
	}
	if !d.serving && !d.closed {
		d.serving = true
		d.wg.Add(3)
		go d.serve()
		go d.dispatch()
		go d.commitLoop()
	}
	return lv, nil
}

// close stops serving, the movers, the dispatcher and the committer and
// waits for them. What they had not finished stays in the levels, to move
// after a restart (or by another broker over the same storage, which
// takes the delay lock once this one lets it go).
func (d *delayer) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.stop()
	d.wg.Wait()
	d.mu.Lock()
	clear(d.due)
	d.due = nil
	clear(d.parked)
	d.mu.Unlock()
}

// discoverEvery is how often a broker over a storage that other brokers
// may share looks for a delay level, until it finds one.
const discoverEvery = time.Second

// discovering starts the discovery loop: every broker over a shared
// storage serves the delays (waits for the delay lock) once a level
// exists, one another broker made after it started included, so that
// delayed messages (and retries, which wait in the levels) do not die with
// the broker that moves them: another takes the lock over when that one
// closes or its lease expires.
func (d *delayer) discovering() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.serving {
		return
	}
	d.wg.Add(1)
	go d.discoverLoop()
}

// discoverLoop runs discover every discoverEvery until this broker serves
// the delays or closes.
func (d *delayer) discoverLoop() {
	defer d.wg.Done()
	t := time.NewTicker(discoverEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if d.discover() {
				return
			}
		case <-d.ctx.Done():
			return
		}
	}
}

// discover serves the delays if the storage holds a delay level; it
// reports whether this broker serves them.
func (d *delayer) discover() (serving bool) {
	d.mu.Lock()
	serving = d.serving
	d.mu.Unlock()
	if serving {
		return true
	}
	metas, err := d.b.storage.Topics(d.ctx)
	if err != nil {
		if d.ctx.Err() == nil {
			d.b.log.Warn("ferry: delayed delivery: listing the topics for delay levels", "err", err)
		}
		return false
	}
	for _, meta := range metas {
		n, ok := delayLevelOf(meta.Name)
		if !ok {
			continue
		}
		if _, err := d.run(n); err != nil {
			if d.ctx.Err() == nil {
				d.b.log.Warn("ferry: delayed delivery: opening a level another broker made", "level", n, "err", err)
			}
			return false
		}
		return true
	}
	return false
}
