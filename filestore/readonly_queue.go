package filestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// A read-only store's queues: reading the segment files another process
// may be writing, and judging what is torn and what is damaged.

// roQueue is a queue of a [ReadOnlyStore]: what it last read of each
// segment file, read on from there each time it looks again.
type roQueue struct {
	st  *ReadOnlyStore
	id  ferry.QueueID
	dir string
	key frameKey

	mu     sync.Mutex // guards segs, buf and closed, and serializes refresh
	segs   []*roSegment
	buf    []byte // the scan buffer
	closed bool
}

// roSegment is what a [ReadOnlyStore] read of a segment file: the
// accounting of its intact frames (segment's fields, f nil), the file's
// length then, the error of the frame after the last intact one and what
// that is.
type roSegment struct {
	segment
	fileSize  int64
	indexSize int64
	bad       error // what is wrong with the frame at size; nil when the file ends there
	// damage is bad, judged damage (any bad frame of a sealed segment;
	// in the newest one, see judgeTail), naming the file and byte; nil
	// for a torn tail, or while the newest segment's is not judged.
	damage error
	// The newest segment's bad frame is judged when asked for
	// (judgeWhen), and the judgement kept for as long as its position,
	// the file's length and its modification time stay the same
	// (judged). lastAt is the bad frame's position at the last look (-1:
	// none), to tell a tail that stalled from one being written.
	judged   tailKey
	isJudged bool
	lastAt   int64
}

// tailKey is what a judgement of a newest segment's tail holds for.
type tailKey struct {
	at, size, mtime int64
}

// judgeWhen says when a read-only queue judges the bad frame ending its
// newest segment (see judgeTail), which reads the rest of the file: only
// when a caller needs to know.
type judgeWhen int

const (
	judgeNever   judgeWhen = iota // Offsets: the frames only
	judgeStalled                  // a Read at the end: once the bad frame stayed where it was since the last look
	judgeNow                      // Segments, a Read beyond the end
)

// ID implements [ferry.Queue].
func (q *roQueue) ID() ferry.QueueID { return q.id }

// Write implements [ferry.WritableQueue]: [ErrReadOnly].
func (q *roQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: err}
	}
	return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ErrReadOnly}
}

// TryWrite implements [ferry.TryWriter]: [ErrReadOnly].
func (q *roQueue) TryWrite(msgs []*ferry.EnhancedMessage) (int64, error) {
	return 0, &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ErrReadOnly}
}

// Close implements [io.Closer]; idempotent.
func (q *roQueue) Close() error {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.st.mu.Lock()
	if q.st.queues[q.id] == q {
		delete(q.st.queues, q.id)
	}
	q.st.mu.Unlock()
	return nil
}

// Offsets implements [ferry.ReadableQueue], looking at the files again.
// An I/O error leaves what it knew.
func (q *roQueue) Offsets() (oldest, next int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		if err := q.refresh(judgeNever); err != nil {
			q.st.cfg.log.Warn("ferry: filestore: read-only refresh", "queue", q.id.String(), "err", err)
		}
	}
	return q.bounds()
}

// bounds returns the offsets known. q.mu must be held.
func (q *roQueue) bounds() (oldest, next int64) {
	if len(q.segs) == 0 {
		return 0, 0
	}
	return q.segs[0].base, q.segs[len(q.segs)-1].next
}

// Read implements [ferry.ReadableQueue]. The messages are decoded for
// this call: the caller owns them.
func (q *roQueue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: err}
	}
	if len(dst) == 0 {
		return 0, nil
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for fresh := false; ; {
		q.mu.Lock()
		if q.closed || q.st.isClosed() {
			q.mu.Unlock()
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: ferry.ErrClosed}
		}
		if _, next := q.bounds(); offset >= next || fresh {
			when := judgeStalled
			if fresh {
				when = judgeNow
			}
			if err := q.refresh(when); err != nil {
				q.mu.Unlock()
				if q.st.isClosed() {
					return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: ferry.ErrClosed}
				}
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: err}
			}
		}
		oldest, next := q.bounds()
		if offset >= next && len(q.segs) > 0 && q.segs[len(q.segs)-1].damage != nil {
			// The offsets from next on lie beyond damage.
			err := q.segs[len(q.segs)-1].damage
			q.mu.Unlock()
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: err}
		}
		if offset < oldest || offset > next {
			q.mu.Unlock()
			if !fresh { // retention may have moved on since
				fresh = true
				continue
			}
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: fmt.Errorf("%w: retained [%d, %d)", ferry.ErrOffsetOutOfRange, oldest, next)}
		}
		if offset < next {
			i := sortSearchSegs(segsOf(q.segs), offset)
			if i < 0 { // a gap between segments: damage
				err := fmt.Errorf("%w: no segment holds it", ferry.ErrCorrupt)
				for _, s := range q.segs {
					if s.base <= offset && s.damage != nil {
						err = s.damage
					}
				}
				q.mu.Unlock()
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: err}
			}
			s := q.segs[i]
			name, e, size, sealed := s.name, s.lookup(offset), s.size, i < len(q.segs)-1
			bad := s.bad
			if s.damage != nil {
				bad = s.damage
			}
			q.mu.Unlock()
			n, err := q.readFile(name, e, offset, size, dst)
			if errors.Is(err, fs.ErrNotExist) && !fresh { // deleted by retention
				fresh = true
				continue
			}
			if err != nil {
				if q.st.isClosed() { // closed while reading: the file went with it
					return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: ferry.ErrClosed}
				}
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: err}
			}
			if n == 0 && sealed && bad != nil {
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: bad}
			}
			if n > 0 {
				return n, nil
			}
		} else {
			q.mu.Unlock()
		}
		fresh = false
		if err := ctx.Err(); err != nil {
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: err}
		}
		if t == nil {
			t = time.NewTimer(readOnlyPoll)
		} else {
			t.Reset(readOnlyPoll)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: ctx.Err()}
		case <-q.st.done:
		}
	}
}

func segsOf(rs []*roSegment) []*segment {
	out := make([]*segment, len(rs))
	for i, s := range rs {
		out[i] = &s.segment
	}
	return out
}

// readFile decodes messages from offset on, in the frames from e up to
// byte limit of segment file name, into dst.
func (q *roQueue) readFile(name string, e indexEntry, offset, limit int64, dst []*ferry.EnhancedMessage) (int, error) {
	f, err := q.st.root.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := newFrameScanner(f, e.pos, limit, q.st.cfg.maxFrameBytes, q.key)
	sc.bufSize = 64 << 10
	want := e.off
	out := dst[:0]
	for len(out) < len(dst) {
		pos := sc.pos()
		fi, enc, err := sc.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("%w (%s at byte %d)", err, name, pos)
		}
		if fi.base != want {
			return 0, fmt.Errorf("%w: frame holds offset %d, want %d (%s at byte %d)", ferry.ErrCorrupt, fi.base, want, name, pos)
		}
		want = fi.next()
		if want <= offset {
			continue
		}
		msgs, err := decodeMessages(nil, fi, enc, offset, q.id.Queue)
		if err != nil {
			return 0, fmt.Errorf("%w (%s at byte %d)", err, name, pos)
		}
		for _, m := range msgs {
			if len(out) == len(dst) {
				break
			}
			out = append(out, m)
		}
	}
	return len(out), nil
}

// refresh lists the queue's segment files and reads each from where it
// last stopped to its end, judging the newest one's tail as when says.
// q.mu must be held.
func (q *roQueue) refresh(when judgeWhen) error {
	entries, err := fs.ReadDir(q.st.root.FS(), q.dir)
	if errors.Is(err, fs.ErrNotExist) {
		q.segs = nil
		return nil
	}
	if err != nil {
		return err
	}
	bases, indexes := listSegments(entries)
	known := map[int64]*roSegment{}
	for _, s := range q.segs {
		known[s.base] = s
	}
	segs := make([]*roSegment, 0, len(bases))
	for i, base := range bases {
		s, ok := known[base]
		if !ok {
			name := segmentName(q.dir, base)
			s = &roSegment{segment: segment{name: name, base: base, next: base}, lastAt: -1}
		}
		newest := i == len(bases)-1
		gone, err := q.readSegment(s, !ok && !newest && indexes[base], newest, when)
		if err != nil {
			return err
		}
		if gone { // deleted by retention since the listing: so are those before it
			segs = segs[:0]
			continue
		}
		s.indexSize = 0
		if indexes[base] {
			if fi, err := fs.Stat(q.st.root.FS(), indexName(q.dir, base)); err == nil {
				s.indexSize = fi.Size()
			}
		}
		segs = append(segs, s)
	}
	q.segs = segs
	return nil
}

// readSegment reads s's file on from s.size, or through its index when
// useIndex and the index passes its checks. A bad frame in a sealed
// segment is damage; in the newest one (newest), it is judged as Open
// judges it (judgeTail) when when says so, and the judgement kept while
// the file stays as it was. gone reports a file that no longer exists.
// q.mu must be held.
func (q *roQueue) readSegment(s *roSegment, useIndex, newest bool, when judgeWhen) (gone bool, err error) {
	f, err := q.st.root.Open(s.name)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	size := fi.Size()
	s.fileSize = size
	if useIndex {
		b, err := readBounded(q.st.root, indexName(q.dir, s.base), indexHeader+4+8*(size/frameHeaderV1+1))
		chk := segment{name: s.name, base: s.base, next: s.base}
		if err == nil && decodeIndex(&chk, b, size, q.key) == nil {
			s.segment = chk
			s.bad, s.damage = nil, nil
			return false, nil
		}
	}
	if size < s.size { // cut (by a repair): read it again from the start
		s.segment = segment{name: s.name, base: s.base, next: s.base}
	}
	if q.buf == nil {
		q.buf = make([]byte, 64<<10)
	}
	cfg := &q.st.cfg
	for {
		pos, err := scanSegment(f, &s.segment, size, cfg.maxFrameBytes, cfg.indexInterval, q.key, &q.buf, nil)
		if err != nil && !isCorrupt(err) {
			return false, fmt.Errorf("%s at byte %d: %w", s.name, pos, err)
		}
		s.bad = err
		switch {
		case err == nil:
			s.damage, s.isJudged, s.lastAt = nil, false, -1
			return false, nil
		case !newest:
			s.damage = fmt.Errorf("%w (%s at byte %d of %d, a sealed segment: damage; messages from offset %d on cannot be read)", err, s.name, pos, size, s.next)
			return false, nil
		}
		key := tailKey{at: pos, size: size, mtime: fi.ModTime().UnixNano()}
		stalled := pos == s.lastAt
		s.lastAt = pos
		if s.isJudged && s.judged == key {
			return false, nil
		}
		s.damage, s.isJudged = nil, false
		if when == judgeNever || when == judgeStalled && !stalled {
			return false, nil
		}
		v, err := judgeTail(f, pos, size, s.next, err, cfg.maxFrameBytes, q.key)
		if err != nil {
			return false, fmt.Errorf("%s at byte %d: %w", s.name, pos, err)
		}
		if v.kind == tailMoved { // written meanwhile: read on
			s.add(v.fi, cfg.indexInterval)
			continue
		}
		s.judged, s.isJudged = key, true
		if v.kind == tailDamage {
			s.damage = fmt.Errorf("%w (%s at byte %d of %d; %s: the owner's next Open refuses the store)", v.err, s.name, pos, size, v.what())
		}
		return false, nil
	}
}
