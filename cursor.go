package ferry

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
)

// Cursor is one consumer group's progress on a topic: per queue, the next
// offset to consume (Kafka's convention: a committed offset is never the
// last one consumed). -1 means nothing was committed for that queue.
type Cursor struct {
	Group   string
	Offsets []int64
}

// Cursors is the progress of every group on one topic.
type Cursors struct {
	Topic  string
	Groups map[string]Cursor
}

// CursorStore is where cursors persist.
//
// Implementations must be safe for concurrent use. After Close every method
// but Close returns [ErrClosed]; Close is idempotent. A nil ctx is
// [ErrInvalidOption]. The seam takes topic before group; user calls take
// group first.
type CursorStore interface {
	// Load returns one next-offset per queue (queues of them) of topic for
	// group; -1 where nothing was committed. An invalid topic name or a
	// negative queue count is [ErrInvalidTopic]. The caller owns the slice.
	Load(ctx context.Context, topic, group string, queues int) ([]int64, error)
	// Commit records offset as the next offset group consumes from queue of
	// topic. A later Commit for the same queue replaces it, even with a
	// lower offset (a reset). A negative queue or offset is an error.
	Commit(ctx context.Context, topic, group string, queue int, offset int64) error
	io.Closer
}

// CursorGroups is an optional interface of a [CursorStore]: it lists the
// groups with cursors on a topic and forgets one for good. The broker
// uses it so that every group with a committed cursor on a topic with
// [Block] overflow holds back its queues, whether or not the group has a
// member in this process or has had one since the broker started, and so
// that [Broker.ForgetGroup] outlasts a restart. Over a store without it,
// only the groups this broker has seen consume hold back Block queues.
//
// Implementations must be safe for concurrent use; after Close both
// methods return [ErrClosed]; a nil ctx is [ErrInvalidOption]. The seam
// takes topic before group; user calls take group first.
type CursorGroups interface {
	// Cursors returns the cursor of every group with a commit on topic,
	// each with queues offsets (-1 for a queue with no commit). An
	// invalid topic name or queue count is [ErrInvalidTopic]. The caller
	// owns the result.
	Cursors(ctx context.Context, topic string, queues int) (Cursors, error)
	// Forget deletes every cursor of group on topic: a Load then returns
	// -1 for each queue. Forgetting a group without cursors does nothing.
	Forget(ctx context.Context, topic, group string) error
}

// FencedCursorStore is an optional interface of a [CursorStore] whose
// commits carry the fencing token of the queue lease they are made under
// (see [Lease.Token]): a commit with a lower token than the last fenced
// commit of the same (topic, group, queue) is refused with [ErrFenced]
// and writes nothing, so a member that lost its lease (partitioned,
// paused, expired) cannot move a cursor back after the next owner moved
// it. A consumer commits through it when its store has it, and treats
// ErrFenced as the loss of its lease. A plain Commit (an operator's
// reset, say) leaves the token as it is. A store that wraps another
// store with this interface (to count or delay commits, say) must wrap
// CommitFenced too, or the consumer's commits bypass its Commit. A nil
// ctx is [ErrInvalidOption]. The seam takes topic before group; user
// calls take group first.
type FencedCursorStore interface {
	CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error
}

// HandoffCursorStore is an optional interface of a [FencedCursorStore]
// that hands a queue from one owner to the next exactly. The new owner
// takes the cursor with TakeCursor, which fences the old owner out before
// it reads: a commit of the old owner still on its way when the lease
// moved is refused rather than land after the new owner read (moving the
// cursor back under it). The old owner's last commit, CommitFinished,
// carries the offsets above the cursor whose messages finished already,
// the queue's finished set, which the new owner skips instead of
// delivering them again: a release that leaves a message unfinished while
// later ones finished (a revoke stops a taken batch; the drain timeout
// gives up on a handler) hands the queue over without duplicates. Over a
// store without it, a late commit of the old owner can land once after
// the take, and those later messages are delivered again (at least once).
//
// TakeCursor raises the token of (topic, group, queue) to token and
// returns the queue's cursor (-1 when none) and its finished set (nil
// when empty; the caller owns it), in one step; a token lower than the
// last is [ErrFenced] and changes nothing. CommitFinished commits offset
// with finished as CommitFenced commits: finished holds at most
// [MaxFinishedSet] offsets, each above offset, in increasing order, or
// the call is [ErrInvalidOption] and writes nothing. Every other commit
// of the queue (Commit, CommitFenced) empties its set; Forget forgets it.
// A store that wraps another with this interface must wrap it too (see
// FencedCursorStore). For store implementers.
type HandoffCursorStore interface {
	FencedCursorStore
	TakeCursor(ctx context.Context, topic, group string, queue int, token uint64) (offset int64, finished []int64, err error)
	CommitFinished(ctx context.Context, topic, group string, queue int, offset int64, finished []int64, token uint64) error
}

// TxCursorStore is an optional interface of a [HandoffCursorStore] that
// advances a queue's cursor in the same transaction as a handler's
// effects: a store kept in the application's own database (sqlstore) gives
// exactly-once effects that way. When a group's cursor store implements
// it, a push consumer calls Begin before each handler call and runs the
// handler with the context Begin returned (the store puts its transaction
// in it, for the handler to write its effects in). When the handler
// returns nil the consumer calls the transaction's Commit, which records
// offset as finished for (topic, group, queue) — refused with [ErrFenced]
// when token is lower than the queue's (its lease moved on), nothing
// written — and commits, all in the one transaction; a Commit that fails
// counts as a failed attempt (the message is retried as after a handler
// error). A handler error or panic calls Rollback. Begin's error fails the
// attempt too.
//
// Load and TakeCursor include what transactions finished: the cursor is
// advanced past the contiguous finished offsets, and TakeCursor's finished
// set holds those above it. CommitFenced and CommitFinished keep the
// offsets above the committed one that transactions finished (they are
// effects done); a plain Commit (a reset: ResetGroup, the ferry command)
// and Forget drop them. Messages a consumer finishes without a handler
// success (dead letters, retries moved off the queue) are committed as
// always. Pull consumers do not use it. For store implementers.
type TxCursorStore interface {
	HandoffCursorStore
	Begin(ctx context.Context, topic, group string, queue int, offset int64, token uint64) (context.Context, CursorTx, error)
}

// CursorTx is the transaction of one handler attempt (see
// [TxCursorStore]): Commit records the message finished and commits;
// Rollback discards everything. The consumer calls exactly one of them,
// once.
type CursorTx interface {
	Commit(ctx context.Context) error
	Rollback() error
}

// MaxFinishedSet bounds the finished set of a queue's cursor (see
// [HandoffCursorStore]): a member with more finished messages above its
// cursor commits the lowest MaxFinishedSet, and the next owner delivers
// the rest again.
const MaxFinishedSet = 1 << 16

// ValidateFinishedSet checks the finished set of a commit at offset (see
// [HandoffCursorStore]). Errors wrap [ErrInvalidOption]. For store
// implementers.
func ValidateFinishedSet(offset int64, finished []int64) error {
	if len(finished) > MaxFinishedSet {
		return fmt.Errorf("%w: finished set of %d offsets, more than %d", ErrInvalidOption, len(finished), MaxFinishedSet)
	}
	last := offset
	for i, o := range finished {
		if o <= last {
			return fmt.Errorf("%w: finished set: offset %d (at %d) not above %d", ErrInvalidOption, o, i, last)
		}
		last = o
	}
	return nil
}

// ValidateTopicCursorsArgs checks the arguments of a call about every
// group's cursors on a topic ([CursorGroups.Cursors]): a valid topic name
// and a queue count in range. Errors wrap [ErrInvalidTopic], for the
// store to wrap in its [Error]. For store implementers.
func ValidateTopicCursorsArgs(topic string, queues int) error {
	if err := ValidateTopicName(topic); err != nil {
		return err
	}
	if queues < 0 || queues > MaxQueues {
		return fmt.Errorf("%w: queue %d out of range", ErrInvalidTopic, queues)
	}
	return nil
}

// MemoryCursorStore is the in-memory [CursorStore], the default, with
// [CursorGroups]. It is safe for concurrent use.
type MemoryCursorStore struct {
	mu      sync.Mutex                       // guards offsets, the cursors in it, and closed
	offsets map[string]map[string]*memCursor // topic -> group -> its cursor
	closed  bool
}

// memCursor is one group's cursor on one topic. A consumer that took a
// queue commits through a cursorSlot, which points at it: no map lookup
// per commit.
type memCursor struct {
	offs     []int64   // per queue, -1 where none
	tokens   []uint64  // per queue, the token of the last fenced commit
	finished [][]int64 // per queue, the finished set (see HandoffCursorStore)
	gone     bool      // forgotten: a slot's commit goes through the maps again
}

// cursorSlot is one queue's cursor in a MemoryCursorStore.
type cursorSlot struct {
	s            *MemoryCursorStore
	c            *memCursor
	topic, group string
	queue        int
}

var (
	_ CursorStore        = (*MemoryCursorStore)(nil)
	_ CursorGroups       = (*MemoryCursorStore)(nil)
	_ FencedCursorStore  = (*MemoryCursorStore)(nil)
	_ HandoffCursorStore = (*MemoryCursorStore)(nil)
)

// NewMemoryCursorStore returns an empty store.
func NewMemoryCursorStore() *MemoryCursorStore {
	return &MemoryCursorStore{offsets: map[string]map[string]*memCursor{}}
}

// ValidateGroupCursorArgs checks the arguments of a call about one group's
// cursor on a topic ([CursorStore.Load], [CursorStore.Commit],
// [FencedCursorStore.CommitFenced], [CursorGroups.Forget]): a valid topic
// name, a group name of 1 to 255 bytes and a queue count or index in
// range. Errors wrap [ErrInvalidTopic] or [ErrInvalidOption], for the store
// to wrap in its [Error]. For store implementers. The seam takes topic
// before group; user calls take group first.
func ValidateGroupCursorArgs(topic, group string, queue int) error {
	if err := ValidateTopicCursorsArgs(topic, queue); err != nil {
		return err
	}
	if group == "" || len(group) > 255 {
		return fmt.Errorf("%w: group name of %d bytes", ErrInvalidOption, len(group))
	}
	return nil
}

// Load implements [CursorStore].
func (s *MemoryCursorStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &Error{Op: "load cursor", Err: err}
	}
	if err := ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, &Error{Op: "load cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "load cursor", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &Error{Op: "load cursor", Err: ErrClosed}
	}
	var offs []int64
	if c := s.offsets[topic][group]; c != nil {
		offs = c.offs
	}
	return fillCursor(offs, queues), nil
}

// fillCursor returns offs as a cursor of queues offsets, -1 where offs
// has none.
func fillCursor(offs []int64, queues int) []int64 {
	out := make([]int64, queues)
	n := copy(out, offs)
	for i := n; i < queues; i++ {
		out[i] = -1
	}
	return out
}

// Commit implements [CursorStore].
func (s *MemoryCursorStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	return s.commit(ctx, topic, group, queue, offset, 0, false)
}

// CommitFenced implements [FencedCursorStore].
func (s *MemoryCursorStore) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	return s.commit(ctx, topic, group, queue, offset, token, true)
}

func (s *MemoryCursorStore) commit(ctx context.Context, topic, group string, queue int, offset int64, token uint64, fenced bool) error {
	if err := ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	if offset < 0 {
		return &Error{Op: "commit cursor", Err: fmt.Errorf("%w: offset %d", ErrOffsetOutOfRange, offset)}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "commit cursor", Err: ErrClosed}
	}
	return s.commitLocked(s.cursorLocked(topic, group), topic, group, queue, offset, token, fenced)
}

// CommitFinished implements [HandoffCursorStore].
func (s *MemoryCursorStore) CommitFinished(ctx context.Context, topic, group string, queue int, offset int64, finished []int64, token uint64) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	if err := ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	if offset < 0 {
		return &Error{Op: "commit cursor", Err: fmt.Errorf("%w: offset %d", ErrOffsetOutOfRange, offset)}
	}
	if err := ValidateFinishedSet(offset, finished); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "commit cursor", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "commit cursor", Err: ErrClosed}
	}
	c := s.cursorLocked(topic, group)
	if err := s.commitLocked(c, topic, group, queue, offset, token, true); err != nil {
		return err
	}
	c.setFinished(queue, finished)
	return nil
}

// TakeCursor implements [HandoffCursorStore].
func (s *MemoryCursorStore) TakeCursor(ctx context.Context, topic, group string, queue int, token uint64) (int64, []int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, nil, &Error{Op: "take cursor", Err: err}
	}
	if err := ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return 0, nil, &Error{Op: "take cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, &Error{Op: "take cursor", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, nil, &Error{Op: "take cursor", Err: ErrClosed}
	}
	c := s.cursorLocked(topic, group)
	for len(c.offs) <= queue {
		c.offs = append(c.offs, -1)
		c.tokens = append(c.tokens, 0)
	}
	if last := c.tokens[queue]; token < last {
		return 0, nil, &Error{Op: fmt.Sprintf("take cursor %s/%s[%d]", topic, group, queue), Err: fmt.Errorf("%w: token %d, last %d", ErrFenced, token, last)}
	}
	c.tokens[queue] = token
	var set []int64
	if queue < len(c.finished) && len(c.finished[queue]) > 0 {
		set = slices.Clone(c.finished[queue])
	}
	return c.offs[queue], set, nil
}

// setFinished sets queue's finished set to a copy of finished. s.mu held.
func (c *memCursor) setFinished(queue int, finished []int64) {
	if len(finished) == 0 {
		if queue < len(c.finished) {
			c.finished[queue] = nil
		}
		return
	}
	for len(c.finished) <= queue {
		c.finished = append(c.finished, nil)
	}
	c.finished[queue] = slices.Clone(finished)
}

// cursorLocked returns group's cursor on topic, making it. s.mu held.
func (s *MemoryCursorStore) cursorLocked(topic, group string) *memCursor {
	groups := s.offsets[topic]
	if groups == nil {
		groups = map[string]*memCursor{}
		s.offsets[topic] = groups
	}
	c := groups[group]
	if c == nil {
		c = &memCursor{}
		groups[group] = c
	}
	return c
}

// commitLocked commits offset to c's queue. s.mu held.
func (s *MemoryCursorStore) commitLocked(c *memCursor, topic, group string, queue int, offset int64, token uint64, fenced bool) error {
	for len(c.offs) <= queue {
		c.offs = append(c.offs, -1)
		c.tokens = append(c.tokens, 0)
	}
	if fenced {
		if last := c.tokens[queue]; token < last {
			return &Error{Op: fmt.Sprintf("commit cursor %s/%s[%d]", topic, group, queue), Err: fmt.Errorf("%w: token %d, last %d", ErrFenced, token, last)}
		}
		c.tokens[queue] = token
	}
	c.offs[queue] = offset
	c.setFinished(queue, nil)
	return nil
}

// slot returns queue's cursor of group on topic, for commitSlot; the
// arguments must be valid (see ValidateGroupCursorArgs).
func (s *MemoryCursorStore) slot(topic, group string, queue int) *cursorSlot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &cursorSlot{s: s, c: s.cursorLocked(topic, group), topic: topic, group: group, queue: queue}
}

// commitSlot is CommitFenced of sl's queue, without the map lookups.
// With finished, the commit is CommitFinished's (finished valid).
func (sl *cursorSlot) commit(offset int64, token uint64, finished []int64) error {
	s := sl.s
	if offset < 0 {
		return &Error{Op: "commit cursor", Err: fmt.Errorf("%w: offset %d", ErrOffsetOutOfRange, offset)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "commit cursor", Err: ErrClosed}
	}
	c := sl.c
	if c.gone {
		c = s.cursorLocked(sl.topic, sl.group)
		sl.c = c
	}
	if err := s.commitLocked(c, sl.topic, sl.group, sl.queue, offset, token, true); err != nil {
		return err
	}
	c.setFinished(sl.queue, finished)
	return nil
}

// Cursors implements [CursorGroups].
func (s *MemoryCursorStore) Cursors(ctx context.Context, topic string, queues int) (Cursors, error) {
	if err := checkContext(ctx); err != nil {
		return Cursors{}, &Error{Op: "list cursors", Err: err}
	}
	if err := ValidateTopicCursorsArgs(topic, queues); err != nil {
		return Cursors{}, &Error{Op: "list cursors", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return Cursors{}, &Error{Op: "list cursors", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Cursors{}, &Error{Op: "list cursors", Err: ErrClosed}
	}
	out := Cursors{Topic: topic, Groups: make(map[string]Cursor, len(s.offsets[topic]))}
	for group, c := range s.offsets[topic] {
		out.Groups[group] = Cursor{Group: group, Offsets: fillCursor(c.offs, queues)}
	}
	return out, nil
}

// Forget implements [CursorGroups].
func (s *MemoryCursorStore) Forget(ctx context.Context, topic, group string) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "forget cursor", Err: err}
	}
	if err := ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return &Error{Op: "forget cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: "forget cursor", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "forget cursor", Err: ErrClosed}
	}
	if c := s.offsets[topic][group]; c != nil {
		c.gone = true
		delete(s.offsets[topic], group)
	}
	if len(s.offsets[topic]) == 0 {
		delete(s.offsets, topic)
	}
	return nil
}

// Close implements [io.Closer]. Idempotent.
func (s *MemoryCursorStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
