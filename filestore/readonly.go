package filestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// ReadOnlyStore is a store opened with [OpenReadOnly]: it reads the
// directory of a [Store] that another process (or this one) may hold
// open and write, for inspection tools. It takes no lock, starts no
// goroutine, never writes, truncates, creates or removes a file (not even
// LOCK or STORE), and recovers nothing: it reads what is on disk each time
// it is asked.
//
//   - Topics and Topic list the topics' metadata files as they are now.
//   - A queue from OpenQueue lists its segment files at each Offsets, and
//     at each Read that needs to, and reads each segment's frames from
//     where it last stopped, so it sees the owner's appends, roll-overs
//     and retention. What follows the last intact frame of the newest
//     segment is judged as Open judges it, telling the owner's writes in
//     progress from either (see [Verify]): a torn tail (space reserved
//     and not yet written, a write in progress, a crash's torn tail) is
//     just the end, looked at again next time; damage (a bad frame with
//     intact ones after it), which the owner's next Open refuses, is
//     [ferry.ErrCorrupt] for a Read at or beyond it, naming the file and
//     byte, and [SegmentInfo].Damage. Judging reads the rest of the file,
//     so it is done when a caller needs it: at Segments, at a Read beyond
//     the end, and at a Read at the end once the tail has not moved
//     between two looks. Sealed segments are read through their index
//     when it passes its checks, scanned otherwise; a bad frame in one
//     is damage.
//     Read blocks, polling the files every 50 ms, until a message is
//     there, ctx is done or the store is closed.
//   - Load and Cursors read the cursor file, which the owner replaces
//     atomically, on every call; cursors are not clamped (see
//     [Store.Recovery]) and fencing tokens, kept in the owner's memory,
//     are not seen.
//
// Every write (Write, TryWrite, SaveTopic, CreateTopic, Commit,
// CommitFenced, Forget) returns [ErrReadOnly]. A frame that fails a check
// anywhere else is [ferry.ErrCorrupt] on Read, naming the file and byte;
// [Verify] checks a whole directory.
//
// A ReadOnlyStore is safe for concurrent use. Close is idempotent and
// makes every later call return [ferry.ErrClosed].
type ReadOnlyStore struct {
	cfg    config
	dir    string
	root   *os.Root
	id     [16]byte
	legacy bool
	done   chan struct{} // closed by Close: wakes polling readers

	mu     sync.Mutex // guards queues and closed
	queues map[ferry.QueueID]*roQueue
	closed bool
}

var (
	_ ferry.Storage           = (*ReadOnlyStore)(nil)
	_ ferry.SharedStorage     = (*ReadOnlyStore)(nil)
	_ ferry.CursorStore       = (*ReadOnlyStore)(nil)
	_ ferry.CursorGroups      = (*ReadOnlyStore)(nil)
	_ ferry.FencedCursorStore = (*ReadOnlyStore)(nil)
	_ ferry.Queue             = (*roQueue)(nil)
	_ ferry.TryWriter         = (*roQueue)(nil)
)

// readOnlyPoll is how often a blocked Read of a [ReadOnlyStore] looks
// at the files again.
var readOnlyPoll = 50 * time.Millisecond

// OpenReadOnly opens the store in dir for reading only, without its lock:
// see [ReadOnlyStore]. Of the options, [WithMaxFrameBytes] (open with at
// least the value the store was written with) and [WithLogger] apply;
// the others are accepted and ignored. A directory that does not exist,
// or holds neither a STORE file nor topics, is an error wrapping
// [fs.ErrNotExist]; a STORE file that fails its check is
// [ferry.ErrCorrupt].
func OpenReadOnly(dir string, opts ...Option) (*ReadOnlyStore, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open %s read-only", dir), Err: err}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open %s read-only", dir), Err: err}
	}
	st := &ReadOnlyStore{cfg: cfg, dir: dir, root: root, done: make(chan struct{}), queues: map[ferry.QueueID]*roQueue{}}
	if st.id, st.legacy, err = readIdentity(root); err != nil {
		_ = root.Close()
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open %s read-only", dir), Err: err}
	}
	return st, nil
}

// readIdentity reads the identity file without creating it: a store from
// before the identity (topics or a cursor file, no STORE) is legacy.
func readIdentity(root *os.Root) (id [16]byte, legacy bool, err error) {
	b, err := readBounded(root, storeFile, storeLen)
	if err == nil {
		return parseIdentity(b)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return id, false, err
	}
	if es, err := fs.ReadDir(root.FS(), "topics"); err == nil && len(es) > 0 {
		return id, true, nil
	}
	if _, err := fs.Stat(root.FS(), cursorFile); err == nil {
		return id, true, nil
	}
	return id, false, fmt.Errorf("no filestore here (no %s file, no topics): %w", storeFile, fs.ErrNotExist)
}

// Dir returns the directory the store was opened on.
func (st *ReadOnlyStore) Dir() string { return st.dir }

// ID returns the store's identity, as 32 hex digits; empty for a store
// from before the identity (format version 1) that was never opened
// since.
func (st *ReadOnlyStore) ID() string {
	if st.id == ([16]byte{}) {
		return ""
	}
	return fmt.Sprintf("%x", st.id[:])
}

func (st *ReadOnlyStore) isClosed() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.closed
}

// Topics implements [ferry.Storage]: the topics whose metadata file is
// there now, sorted by name. A metadata file that fails its check is
// [ferry.ErrCorrupt].
func (st *ReadOnlyStore) Topics(ctx context.Context) ([]ferry.TopicMeta, error) {
	if err := st.check(ctx); err != nil {
		return nil, &ferry.Error{Op: "filestore: topics", Err: err}
	}
	entries, err := fs.ReadDir(st.root.FS(), "topics")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &ferry.Error{Op: "filestore: topics", Err: err}
	}
	var out []ferry.TopicMeta // ReadDir sorts by name
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || ferry.ValidateTopicName(name) != nil {
			continue
		}
		meta, ok, err := readMetaFile(st.root, path.Join("topics", name), name)
		if err != nil {
			return nil, &ferry.Error{Op: "filestore: topics", Err: err}
		}
		if ok {
			out = append(out, meta)
		}
	}
	return out, nil
}

// Topic implements [ferry.SharedStorage].
func (st *ReadOnlyStore) Topic(ctx context.Context, name string) (ferry.TopicMeta, error) {
	if err := st.check(ctx); err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: err}
	}
	if err := ferry.ValidateTopicName(name); err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: err}
	}
	meta, ok, err := readMetaFile(st.root, path.Join("topics", name), name)
	if err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: err}
	}
	if !ok {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: fmt.Errorf("%w: %q", ferry.ErrTopicNotFound, name)}
	}
	return meta, nil
}

// SaveTopic implements [ferry.Storage]: [ErrReadOnly].
func (st *ReadOnlyStore) SaveTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: save topic", Err: err}
	}
	return &ferry.Error{Op: fmt.Sprintf("filestore: save topic %q", meta.Name), Err: ErrReadOnly}
}

// CreateTopic implements [ferry.SharedStorage]: [ErrReadOnly].
func (st *ReadOnlyStore) CreateTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: create topic", Err: err}
	}
	return &ferry.Error{Op: fmt.Sprintf("filestore: create topic %q", meta.Name), Err: ErrReadOnly}
}

// OpenQueue implements [ferry.Storage]. It returns the queue whether or
// not its folder exists (one that does not is empty until it does);
// opening a queue that is open returns it. Its Write returns
// [ErrReadOnly].
func (st *ReadOnlyStore) OpenQueue(ctx context.Context, meta ferry.TopicMeta, queue int) (ferry.Queue, error) {
	return st.queue(ctx, meta, queue)
}

func (st *ReadOnlyStore) queue(ctx context.Context, meta ferry.TopicMeta, queue int) (*roQueue, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "filestore: open queue", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return nil, &ferry.Error{Op: "filestore: open queue", Err: err}
	}
	if queue < 0 || queue >= meta.Queues {
		return nil, &ferry.Error{Op: "filestore: open queue", Err: fmt.Errorf("%w: queue %d of %d in topic %q", ferry.ErrInvalidTopic, queue, meta.Queues, meta.Name)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &ferry.Error{Op: "filestore: open queue", Err: err}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, &ferry.Error{Op: "filestore: open queue", Err: ferry.ErrClosed}
	}
	id := ferry.QueueID{Topic: meta.Name, Queue: queue}
	if q, ok := st.queues[id]; ok {
		return q, nil
	}
	q := &roQueue{st: st, id: id, dir: path.Join("topics", id.Topic, strconv.Itoa(queue)),
		key: frameKey{tag: queueTag(st.id, id.Topic, id.Queue), legacy: st.legacy}}
	st.queues[id] = q
	return q, nil
}

// SegmentInfo describes one segment file of a queue, as a
// [ReadOnlyStore] last read it.
type SegmentInfo struct {
	File       string // path relative to the store's directory
	Base, Next int64  // offsets [Base, Next) in its intact frames
	Bytes      int64  // the file's length
	Frames     int64  // bytes of intact frames, from the start
	IndexBytes int64  // the length of its index file; 0 when it has none
	Sealed     bool   // not the newest segment of its queue
	// FirstTime and LastTime are the store times of its first and last
	// frames; zero when it holds none.
	FirstTime, LastTime time.Time
	// Tail is what follows the intact frames (Bytes - Frames bytes): in
	// the newest segment, space reserved ahead of writes or a write in
	// progress while the owner runs, or a torn tail that the owner's next
	// Open cuts, unless Damage; in a sealed one, damage. TailErr says
	// what was wrong with the first bad frame, nil when the file ends
	// there.
	TailErr error
	// Damage is set when the tail is damage, not a torn tail, judged as
	// Open and [Verify] judge it: in the newest segment, a bad frame with
	// intact ones after it (the owner's next Open refuses the store); in
	// a sealed one, any bad frame. TailErr then wraps
	// [ferry.ErrCorrupt], naming the file and byte.
	Damage bool
}

// Segments returns the segment files of queue queue of topic, oldest
// first, read as they are now. A queue without a folder has none.
func (st *ReadOnlyStore) Segments(ctx context.Context, topic string, queue int) ([]SegmentInfo, error) {
	q, err := st.queue(ctx, ferry.TopicMeta{Name: topic, Queues: queue + 1}, queue)
	if err != nil {
		return nil, &ferry.Error{Op: "filestore: segments", Err: err}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.refresh(judgeNow); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: segments %s", q.id), Err: err}
	}
	out := make([]SegmentInfo, len(q.segs))
	for i, s := range q.segs {
		out[i] = SegmentInfo{
			File: s.name, Base: s.base, Next: s.next, Bytes: s.fileSize, Frames: s.size, IndexBytes: s.indexSize,
			Sealed: i < len(q.segs)-1, TailErr: s.bad, Damage: s.damage != nil,
		}
		if s.damage != nil {
			out[i].TailErr = s.damage
		}
		if s.firstTime != 0 {
			out[i].FirstTime, out[i].LastTime = time.Unix(0, s.firstTime), time.Unix(0, s.lastTime)
		}
	}
	return out, nil
}

// check returns ErrClosed after Close, or ctx's error.
func (st *ReadOnlyStore) check(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if st.isClosed() {
		return ferry.ErrClosed
	}
	return ctx.Err()
}

// readCursors reads the cursor file as it is now.
func (st *ReadOnlyStore) readCursors() (map[cursorKey]int64, error) {
	m := map[cursorKey]int64{}
	b, err := readBounded(st.root, cursorFile, maxCursorFileSz)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if _, err := decodeCursorFile(b, st.id, st.legacy, m, nil); err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, cursorFile)
	}
	return m, nil
}

// Load implements [ferry.CursorStore], reading the cursor file.
func (st *ReadOnlyStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: err}
	}
	if err := st.check(ctx); err != nil {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: err}
	}
	m, err := st.readCursors()
	if err != nil {
		return nil, &ferry.Error{Op: "filestore: load cursor", Err: err}
	}
	out := make([]int64, queues)
	for i := range out {
		off, ok := m[cursorKey{topic, group, i}]
		if !ok {
			off = -1
		}
		out[i] = off
	}
	return out, nil
}

// Cursors implements [ferry.CursorGroups], reading the cursor file.
func (st *ReadOnlyStore) Cursors(ctx context.Context, topic string, queues int) (ferry.Cursors, error) {
	if err := ferry.ValidateTopicCursorsArgs(topic, queues); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: err}
	}
	if err := st.check(ctx); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: err}
	}
	m, err := st.readCursors()
	if err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "filestore: list cursors", Err: err}
	}
	out := ferry.Cursors{Topic: topic, Groups: map[string]ferry.Cursor{}}
	for k, off := range m {
		if k.topic != topic {
			continue
		}
		cur, ok := out.Groups[k.group]
		if !ok {
			cur = ferry.Cursor{Group: k.group, Offsets: slices.Repeat([]int64{-1}, queues)}
			out.Groups[k.group] = cur
		}
		if k.queue < queues {
			cur.Offsets[k.queue] = off
		}
	}
	return out, nil
}

// Commit implements [ferry.CursorStore]: [ErrReadOnly].
func (st *ReadOnlyStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	return &ferry.Error{Op: "filestore: commit cursor", Err: ErrReadOnly}
}

// CommitFenced implements [ferry.FencedCursorStore]: [ErrReadOnly].
func (st *ReadOnlyStore) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: commit cursor", Err: err}
	}
	return &ferry.Error{Op: "filestore: commit cursor", Err: ErrReadOnly}
}

// Forget implements [ferry.CursorGroups]: [ErrReadOnly].
func (st *ReadOnlyStore) Forget(ctx context.Context, topic, group string) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: forget cursor", Err: err}
	}
	return &ferry.Error{Op: "filestore: forget cursor", Err: ErrReadOnly}
}

// Close implements [io.Closer]: it closes the directory and wakes
// blocked readers. It is idempotent.
func (st *ReadOnlyStore) Close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	st.closed = true
	close(st.done)
	return st.root.Close()
}
