package filestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// The cursor file holds every committed cursor:
//
//	u32 CRC-32C of what follows, "FCR2", the store's ID (16 bytes, see
//	identity.go), u32 entry count, then per entry
//	u8 topic length, topic, u8 group length, group, u32 queue, u64 offset
//
// or, once a cursor has a finished set (see [ferry.HandoffCursorStore]),
// "FCR3", whose entries end with the set: uvarint n, then n uvarint
// gaps, each offset of the set minus the one before it (the first minus
// the cursor's offset). A store writes version 2 while no cursor has a
// set, so a file without sets stays readable by a build that knows only
// version 2.
//
// A cursor file of another store fails the ID check. Version 1, without
// the magic and the ID (the count follows the CRC), is read in a store
// upgraded from it and rewritten as version 2 at Open.
// (group names may hold any bytes, so no text format). It is replaced
// whole (temporary file, fsync, rename, fsync of the directory), so it is
// either the old or the new version; a file that fails a check is damage,
// reported as ErrCorrupt.
const (
	cursorFile      = "cursors"
	cursorMagic     = "FCR2"
	cursorMagicSets = "FCR3"
	maxCursorFileSz = 256 << 20
)

type cursorKey struct {
	topic, group string
	queue        int
}

// cursorStore keeps the cursors in memory and one goroutine that writes
// the file: commits that arrive while it writes share the next write.
type cursorStore struct {
	st *Store

	mu      sync.Mutex // guards every field below
	m       map[cursorKey]int64
	sets    map[cursorKey][]int64 // the finished sets, of the cursors that have one
	tokens  map[cursorKey]uint64  // the token of the last fenced commit (memory only)
	gen     uint64                // bumped by every commit
	written uint64                // the gen the file holds
	flushed chan struct{}         // closed (and replaced) after each write
	err     error                 // set once a write failed; every later commit fails
	closed  bool

	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

func openCursors(st *Store) (*cursorStore, error) {
	c := &cursorStore{
		st: st, m: map[cursorKey]int64{}, sets: map[cursorKey][]int64{}, tokens: map[cursorKey]uint64{},
		flushed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
	if err := st.files.remove(cursorFile + ".tmp"); err == nil {
		if err := st.files.syncDir("."); err != nil {
			return nil, err
		}
	}
	b, err := readBounded(st.root, cursorFile, maxCursorFileSz)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		v1, err := c.decode(b)
		if err != nil {
			return nil, fmt.Errorf("%w (file %s)", err, cursorFile)
		}
		if v1 {
			c.gen++ // rewritten as version 2
		}
	}
	// Clamp each cursor to its queue's retained range.
	keys := slices.SortedFunc(mapKeys(c.m), compareKeys)
	for _, k := range keys {
		q, ok := st.queues[ferry.QueueID{Topic: k.topic, Queue: k.queue}]
		if !ok {
			continue
		}
		oldest, next := q.Offsets()
		off := c.m[k]
		to := min(max(off, oldest), next)
		if to == off {
			continue
		}
		c.m[k] = to
		delete(c.sets, k) // its offsets are out of the retained range, or below the cursor
		c.gen++
		st.recovery.ClampedCursors = append(st.recovery.ClampedCursors, ClampedCursor{Topic: k.topic, Group: k.group, Queue: k.queue, From: off, To: to})
		st.cfg.log.Warn("ferry: filestore: cursor clamped to the retained range",
			"topic", k.topic, "group", k.group, "queue", k.queue, "from", off, "to", to, "oldest", oldest, "next", next)
	}
	c.wg.Add(1)
	go c.run()
	if c.gen > 0 {
		c.poke()
	}
	return c, nil
}

func mapKeys(m map[cursorKey]int64) func(func(cursorKey) bool) {
	return func(yield func(cursorKey) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// decode reads a cursor file's bytes into c.m, reporting whether they
// were of version 1.
func (c *cursorStore) decode(b []byte) (v1 bool, err error) {
	return decodeCursorFile(b, c.st.id, c.st.legacy, c.m, c.sets)
}

func (c *cursorStore) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// run writes the file whenever commits are pending; with SyncEvery at
// most once per interval.
func (c *cursorStore) run() {
	defer c.wg.Done()
	policy := c.st.cfg.sync
	for {
		select {
		case <-c.kick:
		case <-c.stop:
			c.flush(policy.mode() != syncNever)
			return
		}
		c.flush(policy.mode() != syncNever)
		if policy.mode() == syncEvery {
			t := time.NewTimer(policy.interval())
			select {
			case <-t.C:
			case <-c.stop:
				t.Stop()
				c.flush(true)
				return
			}
		}
	}
}

// flush writes the file if commits are pending.
func (c *cursorStore) flush(durable bool) {
	c.mu.Lock()
	if c.gen == c.written || c.err != nil {
		c.mu.Unlock()
		return
	}
	gen, data := c.gen, c.encode()
	c.mu.Unlock()
	err := c.st.files.writeFileRename(cursorFile, data, durable)
	c.mu.Lock()
	if err != nil {
		c.err = fmt.Errorf("%w: write cursors: %w", ErrFailed, err)
		c.st.cfg.log.Error("ferry: filestore: cursor store failed", "err", err)
	}
	c.written = gen
	close(c.flushed)
	c.flushed = make(chan struct{})
	c.mu.Unlock()
}

func (c *cursorStore) load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: ferry.ErrClosed}
	}
	out := make([]int64, queues)
	for i := range out {
		off, ok := c.m[cursorKey{topic, group, i}]
		if !ok {
			off = -1
		}
		out[i] = off
	}
	return out, nil
}

// commit commits offset, with finished as its finished set (see
// [ferry.HandoffCursorStore]; nil empties it).
func (c *cursorStore) commit(ctx context.Context, topic, group string, queue int, offset int64, token uint64, fenced bool, finished []int64) error {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	if offset < 0 {
		return &ferry.Error{Op: "filestore: commit cursor", Err: fmt.Errorf("%w: offset %d", ferry.ErrOffsetOutOfRange, offset)}
	}
	if err := ferry.ValidateFinishedSet(offset, finished); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return &ferry.Error{Op: "filestore: commit cursor", Err: ferry.ErrClosed}
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	k := cursorKey{topic, group, queue}
	if fenced {
		if last := c.tokens[k]; token < last {
			c.mu.Unlock()
			return &ferry.Error{Op: fmt.Sprintf("filestore: commit cursor %s/%s[%d]", topic, group, queue), Err: fmt.Errorf("%w: token %d, last %d", ferry.ErrFenced, token, last)}
		}
		c.tokens[k] = token
	}
	c.m[k] = offset
	if len(finished) > 0 {
		c.sets[k] = slices.Clone(finished)
	} else {
		delete(c.sets, k)
	}
	c.gen++
	mine, flushed := c.gen, c.flushed
	c.mu.Unlock()
	c.poke()
	if c.st.cfg.sync.mode() != syncAlways {
		return nil
	}
	for {
		select {
		case <-flushed:
		case <-ctx.Done():
			return &ferry.Error{Op: "filestore: commit cursor", Err: ctx.Err()}
		}
		c.mu.Lock()
		written, err := c.written, c.err
		flushed = c.flushed
		c.mu.Unlock()
		if err != nil {
			return &ferry.Error{Op: "filestore: commit cursor", Err: err}
		}
		if written >= mine {
			return nil
		}
	}
}

// close stops the writer after a last write of pending commits.
func (c *cursorStore) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Load implements [ferry.CursorStore]. Cursors Open clamped come back
// clamped (see [Store.Recovery]).
func (st *Store) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: err}
	}
	return st.cursors.load(ctx, topic, group, queues)
}

// Commit implements [ferry.CursorStore]. With [SyncAlways] it returns once
// the cursor file holding it is durable; concurrent commits share one
// write. Otherwise it returns at once and the file follows the policy.
func (st *Store) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	return st.cursors.commit(ctx, topic, group, queue, offset, 0, false, nil)
}

// CommitFenced implements [ferry.FencedCursorStore] as Commit does. The
// tokens live in memory only: the directory belongs to one process (see
// [ErrLocked]), whose brokers share one coordinator, and a coordinator
// that starts again starts its tokens again, so tokens kept across a
// restart would fence every commit after it.
func (st *Store) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	return st.cursors.commit(ctx, topic, group, queue, offset, token, true, nil)
}

// CommitFinished implements [ferry.HandoffCursorStore] as CommitFenced
// does: the set is written with the cursor, in the same file.
func (st *Store) CommitFinished(ctx context.Context, topic, group string, queue int, offset int64, finished []int64, token uint64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	return st.cursors.commit(ctx, topic, group, queue, offset, token, true, finished)
}

// TakeCursor implements [ferry.HandoffCursorStore]. Its token lives in
// memory, as CommitFenced's.
func (st *Store) TakeCursor(ctx context.Context, topic, group string, queue int, token uint64) (int64, []int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, nil, &ferry.Error{Op: "filestore: take cursor", Err: err}
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return 0, nil, &ferry.Error{Op: "filestore: take cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, &ferry.Error{Op: "filestore: take cursor", Err: err}
	}
	c := st.cursors
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, nil, &ferry.Error{Op: "filestore: take cursor", Err: ferry.ErrClosed}
	}
	k := cursorKey{topic, group, queue}
	if last := c.tokens[k]; token < last {
		return 0, nil, &ferry.Error{Op: fmt.Sprintf("filestore: take cursor %s/%s[%d]", topic, group, queue), Err: fmt.Errorf("%w: token %d, last %d", ferry.ErrFenced, token, last)}
	}
	c.tokens[k] = token
	off, ok := c.m[k]
	if !ok {
		off = -1
	}
	return off, slices.Clone(c.sets[k]), nil
}

// cursors lists every group's cursor on topic.
func (c *cursorStore) cursors(ctx context.Context, topic string, queues int) (ferry.Cursors, error) {
	if err := ferry.ValidateTopicCursorsArgs(topic, queues); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: ferry.ErrClosed}
	}
	out := ferry.Cursors{Topic: topic, Groups: map[string]ferry.Cursor{}}
	for k, off := range c.m {
		if k.topic != topic {
			continue
		}
		cur, ok := out.Groups[k.group]
		if !ok {
			cur = ferry.Cursor{Group: k.group, Offsets: make([]int64, queues)}
			for i := range cur.Offsets {
				cur.Offsets[i] = -1
			}
			out.Groups[k.group] = cur
		}
		if k.queue < queues {
			cur.Offsets[k.queue] = off
		}
	}
	return out, nil
}

// forget deletes group's cursors on topic, durably as commit does.
func (c *cursorStore) forget(ctx context.Context, topic, group string) error {
	if err := ferry.ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return &ferry.Error{Op: "filestore: forget cursor", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &ferry.Error{Op: "filestore: forget cursor", Err: err}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return &ferry.Error{Op: "filestore: forget cursor", Err: ferry.ErrClosed}
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return &ferry.Error{Op: "filestore: forget cursor", Err: err}
	}
	n := len(c.m)
	for k := range c.m {
		if k.topic == topic && k.group == group {
			delete(c.m, k)
			delete(c.sets, k)
			delete(c.tokens, k)
		}
	}
	if len(c.m) == n {
		c.mu.Unlock()
		return nil
	}
	c.gen++
	mine, flushed := c.gen, c.flushed
	c.mu.Unlock()
	c.poke()
	// Forgetting is rare and must outlast a restart: wait for the file
	// whatever the sync policy.
	for {
		select {
		case <-flushed:
		case <-ctx.Done():
			return &ferry.Error{Op: "filestore: forget cursor", Err: ctx.Err()}
		}
		c.mu.Lock()
		written, err := c.written, c.err
		flushed = c.flushed
		c.mu.Unlock()
		if err != nil {
			return &ferry.Error{Op: "filestore: forget cursor", Err: err}
		}
		if written >= mine {
			return nil
		}
	}
}

// Cursors implements [ferry.CursorGroups].
func (st *Store) Cursors(ctx context.Context, topic string, queues int) (ferry.Cursors, error) {
	if err := checkContext(ctx); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: err}
	}
	return st.cursors.cursors(ctx, topic, queues)
}

// Forget implements [ferry.CursorGroups]. It returns once the cursor file
// without group's cursors is written, whatever the sync policy.
func (st *Store) Forget(ctx context.Context, topic, group string) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: forget cursor", Err: err}
	}
	return st.cursors.forget(ctx, topic, group)
}

var (
	_ ferry.CursorStore        = (*Store)(nil)
	_ ferry.CursorGroups       = (*Store)(nil)
	_ ferry.FencedCursorStore  = (*Store)(nil)
	_ ferry.HandoffCursorStore = (*Store)(nil)
)
