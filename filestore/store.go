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
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry"
)

// Store is a [ferry.Storage] and a [ferry.CursorStore] over one directory:
//
//	<dir>/LOCK                            flock held while open
//	<dir>/STORE                           the store's identity (identity.go)
//	<dir>/cursors                         every cursor, replaced atomically
//	<dir>/topics/<topic>/meta             the topic's metadata
//	<dir>/topics/<topic>/<queue>/%020d.log    segments, named by base offset
//	<dir>/topics/<topic>/<queue>/%020d.index  sparse index of a sealed segment
//
// Open recovers every queue and starts a writer goroutine per open queue
// and one for the cursor file; Close stops them, waits for them and
// releases the directory.
//
// A Store is safe for concurrent use.
type Store struct {
	cfg   config
	dir   string
	root  *os.Root
	files fsys     // root, through the fault hook
	fds   *fdCache // descriptors of sealed segments
	lock  *os.File

	mu       sync.Mutex // guards topics, queues, closed and closeErr
	topics   map[string]ferry.TopicMeta
	queues   map[ferry.QueueID]*queue
	closed   bool
	closeErr error

	closeMu sync.Mutex // serializes Close

	id        [16]byte    // the store's identity (identity.go)
	legacy    bool        // version 1 frames, indexes and cursor file are read
	recovery  Recovery    // written by Open only
	scanBuf   []byte      // the scan buffer of recoveries, shared by their segments; Open's, or under mu
	noMmap    atomic.Bool // mapping failed once: write with pwrite
	noReserve atomic.Bool // fallocate is not supported: write with pwrite, reserving nothing
	cursors   *cursorStore
}

var (
	_ ferry.Storage     = (*Store)(nil)
	_ ferry.CursorStore = (*Store)(nil)
)

// Recovery is what [Open] found and repaired.
type Recovery struct {
	// Truncated lists the newest segments cut at a torn or bad frame.
	Truncated []Truncation
	// RebuiltIndexes lists the index files rebuilt from their segments.
	RebuiltIndexes []string
	// ClampedCursors lists the cursors moved into their queue's retained
	// range.
	ClampedCursors []ClampedCursor
}

// Truncation is a torn tail cut from a queue's newest segment.
type Truncation struct {
	Queue ferry.QueueID
	File  string // path relative to the store's directory
	At    int64  // bytes kept
	Cut   int64  // bytes dropped
	Err   error  // what was wrong with the frame at At
	// Damaged: intact frames followed the bad one, so this was damage,
	// not a torn tail, cut because of [WithRepair]. Dropped counts the
	// messages of those intact frames, lost with the cut, and Saved names
	// the file (relative to the store's directory) holding the bytes cut.
	Damaged bool
	Dropped int64
	Saved   string
}

// ClampedCursor is a committed cursor that Open moved into its queue's
// retained range [oldest, next]: below it after retention, or above it
// after recovery cut a torn tail the cursor had seen.
type ClampedCursor struct {
	Topic, Group string
	Queue        int
	From, To     int64
}

// Open opens (creating it if needed) the store in dir. It takes an
// exclusive lock on the directory: a second Open of it, from this process
// or another, fails with [ErrLocked]. It recovers every queue: the newest
// segment of each is read and cut at the first torn or bad frame; a bad
// frame in an older segment is [ferry.ErrCorrupt], naming the file and
// position. Then each committed cursor is clamped to its queue's retained
// range; [Store.Recovery] reports what was repaired.
func Open(dir string, opts ...Option) (*Store, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open %s", dir), Err: err}
	}
	st, err := open(dir, cfg)
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open %s", dir), Err: err}
	}
	return st, nil
}

func open(dir string, cfg config) (_ *Store, err error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := syncPath(filepath.Dir(filepath.Clean(dir))); err != nil {
			return nil, err
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	files := fsys{root: root, fault: cfg.fault}
	lock, err := files.openFile("LOCK", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		_ = root.Close()
		return nil, err
	}
	if err := lockFile(lock); err != nil {
		_ = lock.Close()
		_ = root.Close()
		return nil, err
	}
	if err := files.syncDir("."); err != nil { // LOCK may be new
		_ = lock.Close()
		_ = root.Close()
		return nil, err
	}
	st := &Store{
		cfg: cfg, dir: dir, root: root, files: files, lock: lock, fds: newFDCache(root, cfg.maxOpenSegs),
		topics: map[string]ferry.TopicMeta{},
		queues: map[ferry.QueueID]*queue{},
	}
	defer func() {
		if err != nil {
			_ = st.Close()
		}
	}()
	if err := st.loadIdentity(); err != nil {
		return nil, err
	}
	if err := files.mkdirSync("topics"); err != nil {
		return nil, err
	}
	if err := st.load(); err != nil {
		return nil, err
	}
	st.scanBuf = nil
	if st.cursors, err = openCursors(st); err != nil {
		return nil, err
	}
	return st, nil
}

// load reads every topic's metadata and recovers every queue.
func (st *Store) load() error {
	if err := st.removeDeleted(); err != nil {
		return err
	}
	entries, err := fs.ReadDir(st.root.FS(), "topics")
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || ferry.ValidateTopicName(name) != nil {
			continue
		}
		tdir := path.Join("topics", name)
		meta, ok, err := st.readMeta(tdir, name)
		if err != nil {
			return err
		}
		if ok {
			st.topics[name] = meta
		} else {
			meta = ferry.TopicMeta{Name: name}.Normalized()
		}
		qs, err := fs.ReadDir(st.root.FS(), tdir)
		if err != nil {
			return err
		}
		for _, qe := range qs {
			i, err := strconv.Atoi(qe.Name())
			if !qe.IsDir() || err != nil || i < 0 || i >= ferry.MaxQueues || strconv.Itoa(i) != qe.Name() {
				if strings.HasSuffix(qe.Name(), ".tmp") {
					_ = st.files.remove(path.Join(tdir, qe.Name()))
				}
				continue
			}
			id := ferry.QueueID{Topic: name, Queue: i}
			q, err := st.recoverQueue(id, meta)
			if err != nil {
				return err
			}
			st.queues[id] = q
		}
	}
	return nil
}

// metaFile is the stored form of a topic's metadata, JSON behind a CRC-32C.
type metaFile struct {
	Name        string `json:"name"`
	Queues      int    `json:"queues"`
	MaxMessages int64  `json:"max_messages"`
	MaxBytes    int64  `json:"max_bytes"`
	MaxAge      int64  `json:"max_age_ns"`
	Overflow    int    `json:"overflow"`
	// DedupWindow is absent from the files of earlier versions: zero,
	// the default window.
	DedupWindow int64 `json:"dedup_window_ns,omitempty"`
	// Incarnation is absent from the files of earlier versions: zero.
	Incarnation uint64 `json:"incarnation,omitempty"`
}

func encodeMeta(m ferry.TopicMeta) []byte {
	j, _ := json.Marshal(metaFile{m.Name, m.Queues, m.Retention.MaxMessages, m.Retention.MaxBytes, int64(m.Retention.MaxAge), int(m.Retention.Overflow), int64(m.DedupWindow), m.Incarnation})
	b := binary.LittleEndian.AppendUint32(nil, crc32.Checksum(j, castagnoli))
	return append(b, j...)
}

func (st *Store) readMeta(tdir, name string) (ferry.TopicMeta, bool, error) {
	return readMetaFile(st.root, tdir, name)
}

// readMetaFile reads the metadata of topic name from folder tdir of root;
// ok is false when there is none. [ReadOnlyStore] reads it with it too.
func readMetaFile(root *os.Root, tdir, name string) (_ ferry.TopicMeta, ok bool, _ error) {
	mpath := path.Join(tdir, "meta")
	b, err := readBounded(root, mpath, 64<<10)
	if errors.Is(err, fs.ErrNotExist) {
		return ferry.TopicMeta{}, false, nil
	}
	if err != nil {
		return ferry.TopicMeta{}, false, err
	}
	var mf metaFile
	if len(b) < 4 || crc32.Checksum(b[4:], castagnoli) != binary.LittleEndian.Uint32(b) {
		return ferry.TopicMeta{}, false, fmt.Errorf("%w: %s: bad checksum", ferry.ErrCorrupt, mpath)
	}
	if err := json.Unmarshal(b[4:], &mf); err != nil {
		return ferry.TopicMeta{}, false, fmt.Errorf("%w: %s: %v", ferry.ErrCorrupt, mpath, err)
	}
	meta := ferry.TopicMeta{Name: mf.Name, Queues: mf.Queues, Retention: ferry.Retention{
		MaxMessages: mf.MaxMessages, MaxBytes: mf.MaxBytes, MaxAge: time.Duration(mf.MaxAge), Overflow: ferry.Overflow(mf.Overflow),
	}, DedupWindow: time.Duration(mf.DedupWindow), Incarnation: mf.Incarnation}
	if err := meta.Validate(); err != nil || meta.Name != name {
		return ferry.TopicMeta{}, false, fmt.Errorf("%w: %s: metadata %+v in folder %q", ferry.ErrCorrupt, mpath, meta, name)
	}
	return meta.Normalized(), true, nil
}

// Recovery returns what Open found and repaired.
func (st *Store) Recovery() Recovery { return st.recovery }

// Dir returns the directory the store was opened on.
func (st *Store) Dir() string { return st.dir }

// OpenQueue implements [ferry.Storage]. Opening a queue that is open
// returns it (taking meta's retention); one that was closed is recovered
// from disk again.
func (st *Store) OpenQueue(ctx context.Context, meta ferry.TopicMeta, queue int) (ferry.Queue, error) {
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
	meta = meta.Normalized()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, &ferry.Error{Op: "filestore: open queue", Err: ferry.ErrClosed}
	}
	id := ferry.QueueID{Topic: meta.Name, Queue: queue}
	if q, ok := st.queues[id]; ok {
		q.setRetention(meta.Retention)
		if err := q.setDedupWindow(meta.DedupWindow); err != nil {
			return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open queue %s", id), Err: err}
		}
		return q, nil
	}
	if err := st.files.mkdirSync(path.Join("topics", meta.Name)); err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open queue %s", id), Err: err}
	}
	q, err := st.recoverQueue(id, meta)
	st.scanBuf = nil
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("filestore: open queue %s", id), Err: err}
	}
	st.queues[id] = q
	return q, nil
}

// forget drops a closed queue from the open set.
func (st *Store) forget(q *queue) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.queues[q.id] == q {
		delete(st.queues, q.id)
	}
}

// Topics implements [ferry.Storage].
func (st *Store) Topics(ctx context.Context) ([]ferry.TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "filestore: topics", Err: err}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, &ferry.Error{Op: "filestore: topics", Err: ferry.ErrClosed}
	}
	out := make([]ferry.TopicMeta, 0, len(st.topics))
	for _, m := range st.topics {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b ferry.TopicMeta) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// SaveTopic implements [ferry.Storage]: the metadata is written atomically
// and durably before it returns.
func (st *Store) SaveTopic(ctx context.Context, meta ferry.TopicMeta) error {
	return st.saveTopic(ctx, "save topic", meta, false)
}

// CreateTopic implements [ferry.SharedStorage]: it saves meta, as
// SaveTopic does, unless a topic of that name exists.
func (st *Store) CreateTopic(ctx context.Context, meta ferry.TopicMeta) error {
	return st.saveTopic(ctx, "create topic", meta, true)
}

// Topic implements [ferry.SharedStorage].
func (st *Store) Topic(ctx context.Context, name string) (ferry.TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: err}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: ferry.ErrClosed}
	}
	meta, ok := st.topics[name]
	if !ok {
		return ferry.TopicMeta{}, &ferry.Error{Op: "filestore: topic", Err: fmt.Errorf("%w: %q", ferry.ErrTopicNotFound, name)}
	}
	return meta, nil
}

var _ ferry.SharedStorage = (*Store)(nil)

func (st *Store) saveTopic(ctx context.Context, op string, meta ferry.TopicMeta, ifAbsent bool) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: " + op, Err: err}
	}
	if err := meta.Validate(); err != nil {
		return &ferry.Error{Op: "filestore: " + op, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &ferry.Error{Op: "filestore: " + op, Err: err}
	}
	meta = meta.Normalized()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return &ferry.Error{Op: "filestore: " + op, Err: ferry.ErrClosed}
	}
	if have, ok := st.topics[meta.Name]; ok && ifAbsent {
		if !have.Matches(meta) {
			return &ferry.Error{Op: fmt.Sprintf("filestore: %s %q", op, meta.Name), Err: fmt.Errorf("%w: have %+v, asked %+v", ferry.ErrTopicExists, have, meta)}
		}
		return nil
	}
	tdir := path.Join("topics", meta.Name)
	if err := st.files.mkdirSync(tdir); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("filestore: %s %q", op, meta.Name), Err: err}
	}
	if err := st.files.writeFileRename(path.Join(tdir, "meta"), encodeMeta(meta), true); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("filestore: %s %q", op, meta.Name), Err: err}
	}
	st.topics[meta.Name] = meta
	for id, q := range st.queues {
		if id.Topic == meta.Name {
			q.setRetention(meta.Retention)
			if err := q.setDedupWindow(meta.DedupWindow); err != nil {
				return &ferry.Error{Op: fmt.Sprintf("filestore: %s %q", op, meta.Name), Err: err}
			}
		}
	}
	return nil
}

// Close implements [io.Closer] for both seams: it closes every open queue
// and the cursor store (writing pending cursors), then releases the
// directory. It is idempotent.
func (st *Store) Close() error {
	st.closeMu.Lock()
	defer st.closeMu.Unlock()
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return st.closeErr
	}
	st.closed = true
	qs := make([]*queue, 0, len(st.queues))
	for _, q := range st.queues {
		qs = append(qs, q)
	}
	st.mu.Unlock()
	var errs []error
	for _, q := range qs {
		errs = append(errs, q.Close())
	}
	if st.cursors != nil {
		errs = append(errs, st.cursors.close())
	}
	errs = append(errs, st.fds.closeAll())
	errs = append(errs, st.lock.Close(), st.root.Close())
	err := errors.Join(errs...)
	if err != nil {
		err = &ferry.Error{Op: fmt.Sprintf("filestore: close %s", st.dir), Err: err}
	}
	st.mu.Lock()
	st.closeErr = err
	st.mu.Unlock()
	return err
}
