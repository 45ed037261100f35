package filestore

import (
	"errors"
	"os"
)

// Undoing a failed append, and rolling to a new segment (see write.go).

// undo is a segment's accounting before a write.
type undo struct {
	s                                        *segment
	next, size, sizeSum, firstTime, lastTime int64
	index                                    int
}

// undo takes back a write that failed: it removes the segments the write
// created (those from segsBefore on), newest first, then cuts the
// segments it wrote frames to back to their length before it, and forgets
// those frames. Each step leaves files that Open accepts: a segment's
// removal is made durable before the segment before it is cut (a cut
// segment followed by a later one would leave a gap in the offsets), and
// the first failure stops the undo, leaving frames written but never
// acknowledged, which Open then takes as they are. The accounting is
// restored either way: the queue fails, and reads stop at q.next, which
// the write never moved. wmu must be held.
func (q *queue) undo(touched []undo, segsBefore int) error {
	files := &q.st.files
	rolled := len(q.segs) > segsBefore
	for n := len(q.segs); n > segsBefore; n-- {
		s := q.segs[n-1]
		if err := errors.Join(q.unmap(s), files.remove(s.name)); err != nil {
			return err
		}
		q.segMu.Lock()
		q.segs = q.segs[:n-1]
		q.segMu.Unlock()
		_ = s.f.Close()
		if err := files.syncDir(q.dir); err != nil {
			return err
		}
	}
	act := q.segs[len(q.segs)-1]
	var err error
	if rolled { // sealed by this write: it is the newest again
		_ = files.remove(indexName(q.dir, act.base))
		f := q.st.fds.take(act)
		if f == nil {
			f, err = files.openFile(act.name, os.O_RDWR, 0)
		}
		if err == nil {
			q.segMu.Lock()
			act.f = f
			q.segMu.Unlock()
		}
	}
	q.segMu.Lock()
	q.mu.Lock()
	for _, u := range touched {
		s := u.s
		if s != act {
			continue // removed above
		}
		if err == nil && s.f != nil && u.size < max(s.alloc, s.size) {
			err = files.truncate(s.f, u.size)
		}
		s.alloc = min(s.alloc, u.size)
		s.next, s.size, s.sizeSum, s.firstTime, s.lastTime = u.next, u.size, u.sizeSum, u.firstTime, u.lastTime
		s.index = s.index[:u.index]
	}
	q.mu.Unlock()
	q.segMu.Unlock()
	return err
}

// roll seals the active segment (cut to its length, fdatasync unless
// SyncNever, index file) and starts a new one, which joins q.segs as soon
// as its file exists, so that the undo of a failed write removes it. Each
// step leaves files Open accepts: until the new file exists the old
// segment is the newest, whose index Open ignores.
func (q *queue) roll() error {
	q.segMu.RLock()
	old := q.segs[len(q.segs)-1]
	idx := encodeIndex(old, q.key.tag)
	base := old.next
	q.segMu.RUnlock()
	if _, err := q.seal(old); err != nil {
		return err
	}
	files := &q.st.files
	if q.cfg.sync.mode() != syncNever {
		if err := files.sync(old.f); err != nil {
			return err
		}
		q.dirty = false
	}
	if err := files.writeFileRename(indexName(q.dir, old.base), idx, false); err != nil {
		return err
	}
	name := segmentName(q.dir, base)
	f, err := files.openFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	s := &segment{name: name, f: f, base: base, next: base}
	// The old segment's descriptor goes to the cache of sealed ones (a
	// SyncEvery sync still on it finishes first).
	q.syncMu.Lock()
	q.segMu.Lock()
	q.segs = append(q.segs, s)
	oldf := old.f
	old.f = nil
	q.segMu.Unlock()
	q.syncMu.Unlock()
	q.st.fds.put(old, oldf)
	if err := files.syncDir(q.dir); err != nil {
		return err
	}
	q.mapActive(s)
	return nil
}
