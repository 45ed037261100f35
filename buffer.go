package ferry

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Buffer defaults, applied to zero fields of [BufferConfig].
const (
	DefaultBufferMessages = 1024      // RocketMQ Go's pullThresholdForQueue
	DefaultBufferBytes    = 100 << 20 // 100 MiB of Message.Size (RocketMQ Java's)
	DefaultHighWatermark  = 1.0
	DefaultLowWatermark   = 0.5
	DefaultMaxSpan        = 2000 // RocketMQ Java's consumeConcurrentlyMaxSpan
)

// BufferConfig sizes a [Buffer]. Zero fields take their defaults.
type BufferConfig struct {
	// MaxMessages is the capacity in messages. Default [DefaultBufferMessages].
	MaxMessages int
	// MaxBytes is the capacity in bytes of [Message.Size]. Default
	// [DefaultBufferBytes].
	MaxBytes int64
	// HighWatermark, a fraction of the capacity in (0, 1], is where Put
	// stops taking messages and fetching pauses. Default
	// [DefaultHighWatermark]. It rounds down to whole messages and bytes,
	// but to at least one of each.
	HighWatermark float64
	// LowWatermark, a fraction of the capacity in [0, HighWatermark), is
	// where a paused buffer lets Put resume. Default [DefaultLowWatermark].
	// It rounds down to whole messages and bytes, and to below the rounded
	// high watermark.
	LowWatermark float64
	// MaxSpan bounds the distance between the oldest unfinished offset and
	// the newest buffered one: Put takes no message at or beyond oldest
	// unfinished + MaxSpan. Default [DefaultMaxSpan].
	MaxSpan int64
}

func (c BufferConfig) withDefaults() BufferConfig {
	if c.MaxMessages == 0 {
		c.MaxMessages = DefaultBufferMessages
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultBufferBytes
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = DefaultHighWatermark
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = min(DefaultLowWatermark, c.HighWatermark/2)
	}
	if c.MaxSpan == 0 {
		c.MaxSpan = DefaultMaxSpan
	}
	return c
}

func (c BufferConfig) validate() error {
	switch {
	case c.MaxMessages < 1:
		return fmt.Errorf("%w: buffer of %d messages", ErrInvalidOption, c.MaxMessages)
	case c.MaxBytes < 1:
		return fmt.Errorf("%w: buffer of %d bytes", ErrInvalidOption, c.MaxBytes)
	case !(c.HighWatermark > 0 && c.HighWatermark <= 1):
		return fmt.Errorf("%w: high watermark %v not in (0, 1]", ErrInvalidOption, c.HighWatermark)
	case !(c.LowWatermark >= 0 && c.LowWatermark < c.HighWatermark):
		return fmt.Errorf("%w: low watermark %v not in [0, high %v)", ErrInvalidOption, c.LowWatermark, c.HighWatermark)
	case c.MaxSpan < 1:
		return fmt.Errorf("%w: max span %d", ErrInvalidOption, c.MaxSpan)
	}
	return nil
}

// BufferStats is a snapshot of a [Buffer].
type BufferStats struct {
	// Messages and Bytes count the unfinished messages: put and not yet
	// done, whether taken or not.
	Messages int
	Bytes    int64
	// Pending counts the messages put and not yet taken.
	Pending int
	// InFlight counts the messages taken and not yet done.
	InFlight int
	// PeakMessages and PeakBytes are the highest Messages and Bytes seen
	// since the buffer was made or last Reset.
	PeakMessages int
	PeakBytes    int64
	// Paused reports whether Put would wait now: for the message Put
	// last waited for or left out, while that is still to be put, else for
	// an empty message at the next fetched offset.
	Paused bool
	// Committable is [Buffer.Committable].
	Committable int64
}

// bufEntry is one unfinished message; m is nil once it is done.
type bufEntry struct {
	m         *EnhancedMessage
	offset    int64
	size      int64
	abandoned bool // taken, then given up: no longer in flight
}

// Buffer is a per-queue cache between fetching and handling: a fetcher
// [Buffer.Put]s messages in offset order, handlers [Buffer.Take] them and
// mark them [Buffer.Done] in any order. It gives flow control (Put waits
// while the buffer is paused: it pauses when it reaches its high watermark
// and resumes once it falls to its low watermark, and it waits as long as
// the next message would take it over the high watermark or the max span,
// unless it holds nothing; the wait is signalled, never polled), the
// offset to commit ([Buffer.Committable]: the smallest unfinished offset,
// or the next fetched offset when nothing is unfinished), and the lock
// ordered consumption holds while handling ([Buffer.Lock]).
//
// A Buffer is safe for concurrent use. It starts no goroutine.
type Buffer struct {
	cfg       BufferConfig
	highMsgs  int
	lowMsgs   int
	highBytes int64
	lowBytes  int64

	consume chan struct{} // the consumption lock: full when held

	mu       sync.Mutex // guards every field below
	entries  []bufEntry // unfinished and done-but-not-head entries, by offset
	head     int        // entries[head:] are live
	taken    int        // entries[head:taken] were taken; entries[taken:] are pending
	count    int        // unfinished entries
	bytes    int64      // Size of unfinished entries
	inflight int        // taken and not done
	next     int64      // next offset to fetch
	want     int64      // offset of the message Put last waited for or left out
	wantSize int64      // its Size; want and wantSize count only while want >= next
	full     bool       // paused by the high watermark until the low one
	room     chan struct{}
	drained  chan struct{}
	closed   bool
	peakMsgs int
	peakB    int64
}

// NewBuffer returns an empty buffer whose next fetched offset is 0. A
// config value out of range is [ErrInvalidOption].
func NewBuffer(cfg BufferConfig) (*Buffer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, &Error{Op: "new buffer", Err: err}
	}
	return newBuffer(cfg), nil
}

func newBuffer(cfg BufferConfig) *Buffer {
	b := &Buffer{cfg: cfg, consume: make(chan struct{}, 1)}
	b.highMsgs = max(1, int(float64(cfg.MaxMessages)*cfg.HighWatermark))
	b.lowMsgs = min(int(float64(cfg.MaxMessages)*cfg.LowWatermark), b.highMsgs-1)
	b.highBytes = max(1, int64(float64(cfg.MaxBytes)*cfg.HighWatermark))
	b.lowBytes = min(int64(float64(cfg.MaxBytes)*cfg.LowWatermark), b.highBytes-1)
	return b
}

// Config returns the buffer's configuration, defaults filled in.
func (b *Buffer) Config() BufferConfig { return b.cfg }

// Reset empties the buffer and sets the next fetched offset to next. Taken
// messages not yet done are forgotten: a later Done for them is ignored.
func (b *Buffer) Reset(next int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.entries)
	b.entries, b.head, b.taken = b.entries[:0], 0, 0
	b.count, b.bytes, b.inflight = 0, 0, 0
	b.next, b.want, b.wantSize = next, 0, 0
	b.full = false
	b.peakMsgs, b.peakB = 0, 0
	b.signalRoom()
	b.signalDrained()
}

// Put appends msgs, which must continue the offsets put so far in
// increasing order, and returns how many it took from the front of msgs.
//
// Put takes a message when the buffer holds nothing unfinished (so a
// message larger than the whole buffer goes in, alone), or when the buffer
// is not paused by its high watermark, the message keeps the unfinished
// messages under the high watermark (in messages, and in bytes counting
// its own [Message.Size]), and its offset is within the max span of the
// oldest unfinished one. Reaching the high watermark, or leaving a message
// out for it, pauses the buffer until it falls to its low watermark.
//
// Put waits, signalled by [Buffer.Done], [Buffer.Reset], [Buffer.Advance]
// and [Buffer.Close], never polling, until it can take msgs[0]; then it
// takes messages in order while they can be taken. So with msgs not empty
// it returns at least 1 and a nil error, or else 0 and an error: ctx's
// error when ctx is done first, [ErrClosed] once the buffer is closed,
// [ErrInvalidMessage] for a nil message and [ErrOffsetOutOfRange] for one
// at an offset below the next fetched offset. Those two errors, for a
// later message, come back with the count of the messages before it,
// which stay taken. Empty msgs returns 0 and a nil error at once. The
// buffer keeps the pointers.
func (b *Buffer) Put(ctx context.Context, msgs []*EnhancedMessage) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &Error{Op: "buffer put", Err: err}
	}
	n, _, err := b.put(ctx, msgs, true)
	return n, err
}

// put is Put; without wait, where Put would wait for room it returns 0,
// true and no error at once.
func (b *Buffer) put(ctx context.Context, msgs []*EnhancedMessage, wait bool) (int, bool, error) {
	if len(msgs) == 0 {
		return 0, false, nil
	}
	b.mu.Lock()
	for {
		if b.closed {
			b.mu.Unlock()
			return 0, false, &Error{Op: "buffer put", Err: ErrClosed}
		}
		if err := b.checkLocked(0, msgs[0]); err != nil {
			b.mu.Unlock()
			return 0, false, err
		}
		b.want, b.wantSize = msgs[0].Offset, int64(msgs[0].Size())
		if !b.pausedLocked() {
			break
		}
		if !wait {
			b.mu.Unlock()
			return 0, true, nil
		}
		if b.room == nil {
			b.room = make(chan struct{})
		}
		room := b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return 0, false, &Error{Op: "buffer put", Err: ctx.Err()}
		}
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	n := 0
	for i, m := range msgs {
		if err := b.checkLocked(i, m); err != nil {
			return n, false, err
		}
		size := int64(m.Size())
		if !b.fitsLocked(m.Offset, size) {
			b.want, b.wantSize = m.Offset, size
			if b.count >= b.highMsgs || b.bytes+size > b.highBytes {
				b.full = true // left out for the watermark, not the span
			}
			break
		}
		b.entries = append(b.entries, bufEntry{m: m, offset: m.Offset, size: size})
		b.count++
		b.bytes += size
		b.next = m.Offset + 1
		n++
		b.peakMsgs = max(b.peakMsgs, b.count)
		b.peakB = max(b.peakB, b.bytes)
		if b.count >= b.highMsgs || b.bytes >= b.highBytes {
			b.full = true
		}
	}
	return n, false, nil
}

// checkLocked checks msgs[i], m, for Put. b.mu held.
func (b *Buffer) checkLocked(i int, m *EnhancedMessage) error {
	if m == nil {
		return &Error{Op: fmt.Sprintf("buffer put: message %d", i), Err: fmt.Errorf("%w: nil", ErrInvalidMessage)}
	}
	if m.Offset < b.next {
		return &Error{Op: "buffer put", Err: fmt.Errorf("%w: offset %d after %d", ErrOffsetOutOfRange, m.Offset, b.next-1)}
	}
	return nil
}

// Advance moves the next fetched offset forward to next, for messages the
// fetcher read but did not put (filtered out), or after a reset of the
// cursor. A lower offset is ignored. With nothing unfinished it moves
// [Buffer.Committable] too.
func (b *Buffer) Advance(next int64) { b.advance(next) }

// advance is Advance; it reports whether [Buffer.Committable] moved.
func (b *Buffer) advance(next int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if next <= b.next {
		return false
	}
	b.next = next
	b.signalRoom() // a waiting Put's message may now be out of range
	return b.head >= len(b.entries)
}

// Next returns the next offset to fetch.
func (b *Buffer) Next() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.next
}

// oldestLocked returns the smallest unfinished offset, or next. b.mu held.
func (b *Buffer) oldestLocked() int64 {
	if b.head < len(b.entries) {
		return b.entries[b.head].offset
	}
	return b.next
}

// fitsLocked reports whether Put can take a message of size at offset
// now. It clears full once the buffer is at its low watermark. b.mu held.
func (b *Buffer) fitsLocked(offset, size int64) bool {
	if b.count == 0 {
		b.full = false
		return true
	}
	if b.full {
		if b.count > b.lowMsgs || b.bytes > b.lowBytes {
			return false
		}
		b.full = false
	}
	return b.count < b.highMsgs && b.bytes+size <= b.highBytes &&
		offset-b.oldestLocked() < b.cfg.MaxSpan
}

// pausedLocked reports whether Put must wait for the message it waits for
// or left out last, or, with none, for an empty message at next. b.mu held.
func (b *Buffer) pausedLocked() bool {
	if b.want >= b.next {
		return !b.fitsLocked(b.want, b.wantSize)
	}
	return !b.fitsLocked(b.next, 0)
}

// Take moves up to len(dst) pending messages, oldest first, into dst and
// returns how many, and how many are still pending. It never waits. After
// Close it takes nothing.
func (b *Buffer) Take(dst []*EnhancedMessage) (n, pending int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.takeLocked(dst)
}

// takeShare is Take of one taker's share when ways takers share the
// pending messages: a ceil(pending/ways), at least one, and at least
// least, at most len(dst). It reads the pending count under the same lock
// as it takes.
func (b *Buffer) takeShare(dst []*EnhancedMessage, ways, least int) (n, pending int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := min(len(dst), max(1, least, (b.pendingLocked()+ways-1)/ways))
	return b.takeLocked(dst[:k])
}

// takeLocked is Take. b.mu held.
func (b *Buffer) takeLocked(dst []*EnhancedMessage) (n, pending int) {
	if b.closed {
		return 0, 0
	}
	if b.taken < b.head {
		b.taken = b.head
	}
	for n < len(dst) && b.taken < len(b.entries) {
		if e := b.entries[b.taken]; e.m != nil {
			dst[n] = e.m
			n++
		}
		b.taken++
	}
	b.inflight += n
	return n, len(b.entries) - b.taken
}

// Pending returns how many messages are put and not yet taken.
func (b *Buffer) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pendingLocked()
}

// pendingLocked is Pending. b.mu held.
func (b *Buffer) pendingLocked() int { return len(b.entries) - max(b.taken, b.head) }

// Done marks taken messages finished: they leave the buffer, the
// committable offset moves up to the smallest unfinished one, and a paused
// buffer may resume. Messages the buffer does not hold (after a Reset,
// done twice, or nil) are ignored. It returns the committable offset.
func (b *Buffer) Done(msgs ...*EnhancedMessage) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		if m == nil {
			continue
		}
		i := b.findLocked(m.Offset)
		if i < 0 || i >= b.taken || b.entries[i].m != m {
			continue
		}
		e := &b.entries[i]
		if !e.abandoned {
			b.inflight--
		}
		e.m = nil
		b.count--
		b.bytes -= e.size
	}
	for b.head < len(b.entries) && b.entries[b.head].m == nil {
		b.head++
	}
	if b.head == len(b.entries) {
		b.entries, b.head, b.taken = b.entries[:0], 0, 0
	} else if b.head >= 1024 && b.head >= len(b.entries)/2 {
		live := copy(b.entries, b.entries[b.head:])
		clear(b.entries[live:])
		b.entries = b.entries[:live]
		b.taken -= b.head
		b.head = 0
	}
	if !b.pausedLocked() {
		b.signalRoom()
	}
	if b.inflight == 0 {
		b.signalDrained()
	}
	return b.oldestLocked()
}

// findLocked returns the index of the live entry at offset, or -1.
func (b *Buffer) findLocked(offset int64) int {
	live := b.entries[b.head:]
	if len(live) == 0 {
		return -1
	}
	if d := offset - live[0].offset; d >= 0 && d < int64(len(live)) && live[d].offset == offset {
		return b.head + int(d) // contiguous offsets: the common case
	}
	i := sort.Search(len(live), func(i int) bool { return live[i].offset >= offset })
	if i < len(live) && live[i].offset == offset {
		return b.head + i
	}
	return -1
}

// Committable returns the offset to commit: the smallest unfinished
// offset, or the next fetched offset when nothing is unfinished.
func (b *Buffer) Committable() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.oldestLocked()
}

// WaitDrained waits until no taken message is unfinished or ctx is done
// (ctx's error). To drain for good, Close first: no take follows.
func (b *Buffer) WaitDrained(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "buffer wait drained", Err: err}
	}
	b.mu.Lock()
	if b.inflight == 0 {
		b.mu.Unlock()
		return nil
	}
	if b.drained == nil {
		b.drained = make(chan struct{})
	}
	ch := b.drained
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns a snapshot of the buffer.
func (b *Buffer) Stats() BufferStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BufferStats{
		Messages:     b.count,
		Bytes:        b.bytes,
		Pending:      b.pendingLocked(),
		InFlight:     b.inflight,
		PeakMessages: b.peakMsgs,
		PeakBytes:    b.peakB,
		Paused:       b.pausedLocked(),
		Committable:  b.oldestLocked(),
	}
}

// Lock takes the buffer's consumption lock, which ordered consumption holds
// while handling the queue's messages, waiting until it is free or ctx is
// done (ctx's error). It is not reentrant.
func (b *Buffer) Lock(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "buffer lock", Err: err}
	}
	select {
	case b.consume <- struct{}{}:
		return nil
	default:
	}
	select {
	case b.consume <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryLock takes the consumption lock if it is free and reports whether it
// did.
func (b *Buffer) TryLock() bool {
	select {
	case b.consume <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock releases the consumption lock. Unlocking a free lock is a no-op.
func (b *Buffer) Unlock() {
	select {
	case <-b.consume:
	default:
	}
}

// Close stops the buffer handing out messages: it wakes a waiting Put,
// later Puts return [ErrClosed] and Take takes nothing. Messages already
// taken can still be marked done, and WaitDrained waits for them.
// Idempotent.
func (b *Buffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.signalRoom()
}

func (b *Buffer) signalRoom() {
	if b.room != nil {
		close(b.room)
		b.room = nil
	}
}

func (b *Buffer) signalDrained() {
	if b.drained != nil {
		close(b.drained)
		b.drained = nil
	}
}

// abandon gives up on taken messages without finishing them: they stop
// counting as in flight (so a drain does not wait for them) but stay
// unfinished, holding the committable offset below them. Abandoning a
// message twice is a no-op; a later Done still finishes it.
func (b *Buffer) abandon(msgs ...*EnhancedMessage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		if m == nil {
			continue
		}
		if i := b.findLocked(m.Offset); i >= 0 && i < b.taken && b.entries[i].m == m && !b.entries[i].abandoned {
			b.entries[i].abandoned = true
			b.inflight--
		}
	}
	if b.inflight == 0 {
		b.signalDrained()
	}
}
