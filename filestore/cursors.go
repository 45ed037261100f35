package filestore

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"slices"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// The cursor file holds every committed cursor: a CRC-32C, then a JSON
// array of entries. It is replaced whole (temporary file, fsync, rename,
// fsync of the directory), so it is either the old or the new version;
// a file that fails its checksum is damage, reported as ErrCorrupt.
const (
	cursorFile      = "cursors"
	maxCursorFileSz = 256 << 20
)

type cursorKey struct {
	topic, group string
	queue        int
}

type cursorEntry struct {
	Topic  string `json:"t"`
	Group  string `json:"g"`
	Queue  int    `json:"q"`
	Offset int64  `json:"o"`
}

// cursorStore keeps the cursors in memory and one goroutine that writes
// the file: commits that arrive while it writes share the next write.
type cursorStore struct {
	st *Store

	mu      sync.Mutex // guards every field below
	m       map[cursorKey]int64
	gen     uint64        // bumped by every commit
	written uint64        // the gen the file holds
	flushed chan struct{} // closed (and replaced) after each write
	err     error         // set once a write failed; every later commit fails
	closed  bool

	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

func openCursors(st *Store) (*cursorStore, error) {
	c := &cursorStore{
		st: st, m: map[cursorKey]int64{},
		flushed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
	if err := st.root.Remove(cursorFile + ".tmp"); err == nil {
		if err := syncDir(st.root, "."); err != nil {
			return nil, err
		}
	}
	b, err := readBounded(st.root, cursorFile, maxCursorFileSz)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := c.decode(b); err != nil {
			return nil, fmt.Errorf("%w (file %s)", err, cursorFile)
		}
	}
	// Clamp each cursor to its queue's retained range.
	keys := slices.SortedFunc(mapKeys(c.m), func(a, b cursorKey) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.group, b.group), cmp.Compare(a.queue, b.queue))
	})
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

func (c *cursorStore) decode(b []byte) error {
	if len(b) < 4 || crc32.Checksum(b[4:], castagnoli) != binary.LittleEndian.Uint32(b) {
		return fmt.Errorf("%w: cursor file checksum", ferry.ErrCorrupt)
	}
	var es []cursorEntry
	if err := json.Unmarshal(b[4:], &es); err != nil {
		return fmt.Errorf("%w: cursor file: %v", ferry.ErrCorrupt, err)
	}
	for _, e := range es {
		if err := ferry.ValidateCursorArgs(e.Topic, e.Group, e.Queue); err != nil || e.Offset < 0 {
			return fmt.Errorf("%w: cursor entry %+v", ferry.ErrCorrupt, e)
		}
		c.m[cursorKey{e.Topic, e.Group, e.Queue}] = e.Offset
	}
	return nil
}

func (c *cursorStore) encode() []byte {
	es := make([]cursorEntry, 0, len(c.m))
	for k, o := range c.m {
		es = append(es, cursorEntry{k.topic, k.group, k.queue, o})
	}
	slices.SortFunc(es, func(a, b cursorEntry) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Queue, b.Queue))
	})
	j, _ := json.Marshal(es)
	return append(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(j, castagnoli)), j...)
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
			c.flush(policy.mode != syncNever)
			return
		}
		c.flush(policy.mode != syncNever)
		if policy.mode == syncEvery {
			t := time.NewTimer(policy.interval)
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
	err := writeFileRename(c.st.root, cursorFile, data, durable)
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
	if err := ferry.ValidateCursorArgs(topic, group, queues); err != nil {
		return nil, fmt.Errorf("ferry: load cursor: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ferry: load cursor: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("ferry: load cursor: %w", ferry.ErrClosed)
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

func (c *cursorStore) commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := ferry.ValidateCursorArgs(topic, group, queue); err != nil {
		return fmt.Errorf("ferry: commit cursor: %w", err)
	}
	if offset < 0 {
		return fmt.Errorf("ferry: commit cursor: %w: offset %d", ferry.ErrOffsetOutOfRange, offset)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ferry: commit cursor: %w", err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("ferry: commit cursor: %w", ferry.ErrClosed)
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("ferry: commit cursor: %w", err)
	}
	c.m[cursorKey{topic, group, queue}] = offset
	c.gen++
	mine, flushed := c.gen, c.flushed
	c.mu.Unlock()
	c.poke()
	if c.st.cfg.sync.mode != syncAlways {
		return nil
	}
	for {
		select {
		case <-flushed:
		case <-ctx.Done():
			return fmt.Errorf("ferry: commit cursor: %w", ctx.Err())
		}
		c.mu.Lock()
		written, err := c.written, c.err
		flushed = c.flushed
		c.mu.Unlock()
		if err != nil {
			return fmt.Errorf("ferry: commit cursor: %w", err)
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
	return st.cursors.load(ctx, topic, group, queues)
}

// Commit implements [ferry.CursorStore]. With [SyncAlways] it returns once
// the cursor file holding it is durable; concurrent commits share one
// write. Otherwise it returns at once and the file follows the policy.
func (st *Store) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	return st.cursors.commit(ctx, topic, group, queue, offset)
}
