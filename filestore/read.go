package filestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/ferrymq/ferry"
)

// Offsets implements [ferry.ReadableQueue].
func (q *queue) Offsets() (oldest, next int64) {
	q.expire()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.oldest, q.next
}

// Read implements [ferry.ReadableQueue]. Recent messages come from the
// cache, shared with every reader; older ones are decoded from disk.
func (q *queue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: err}
	}
	if len(dst) == 0 {
		return 0, nil
	}
	q.expire()
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: ferry.ErrClosed}
		}
		if offset < q.oldest || offset > q.next {
			oldest, next := q.oldest, q.next
			q.mu.Unlock()
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: fmt.Errorf("%w: retained [%d, %d)", ferry.ErrOffsetOutOfRange, oldest, next)}
		}
		if offset < q.next {
			if offset >= q.cacheBase {
				n := copy(dst, q.cache[q.cacheHead+int(offset-q.cacheBase):])
				q.mu.Unlock()
				return n, nil
			}
			limit := q.next
			q.mu.Unlock()
			n, err := q.readDisk(offset, limit, dst)
			if err != nil {
				return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s at %d", q.id, offset), Err: err}
			}
			return n, nil
		}
		if err := ctx.Err(); err != nil {
			q.mu.Unlock()
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: err}
		}
		ch := make(chan struct{}, 1)
		q.readers = append(q.readers, ch)
		q.mu.Unlock()
		select {
		case <-ch:
			q.mu.Lock()
		case <-ctx.Done():
			q.mu.Lock()
			if i := slices.Index(q.readers, ch); i >= 0 {
				q.readers = slices.Delete(q.readers, i, i+1)
			}
			q.mu.Unlock()
			return 0, &ferry.Error{Op: fmt.Sprintf("filestore: read %s", q.id), Err: ctx.Err()}
		}
	}
}

// readDisk decodes messages from offset (below limit) into dst from the
// segment that holds offset.
func (q *queue) readDisk(offset, limit int64, dst []*ferry.EnhancedMessage) (int, error) {
	q.segMu.RLock()
	defer q.segMu.RUnlock()
	if q.segsClosed {
		return 0, ferry.ErrClosed
	}
	q.mu.Lock() // the active segment's accounting grows under mu
	i := sortSearchSegs(q.segs, offset)
	if i < 0 {
		q.mu.Unlock()
		return 0, fmt.Errorf("%w: retained from %d", ferry.ErrOffsetOutOfRange, q.segs[0].base)
	}
	s := q.segs[i]
	e, size := s.lookup(offset), s.size
	q.mu.Unlock()
	var r io.ReaderAt = s.f // changes under segMu only
	if s.f == nil {         // sealed
		fe, err := q.st.fds.acquire(s)
		if err != nil {
			return 0, err
		}
		defer q.st.fds.release(fe)
		r = fe.f
	}
	sc := newFrameScanner(r, e.pos, size, q.cfg.maxFrameBytes, q.key)
	sc.bufSize = 64 << 10
	want := e.off
	out := dst[:0]
	for len(out) < len(dst) {
		pos := sc.pos()
		fi, enc, err := sc.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, fmt.Errorf("%w (%s at byte %d)", err, s.name, pos)
		}
		if fi.base != want {
			return 0, fmt.Errorf("%w: frame holds offset %d, want %d (%s at byte %d)", ferry.ErrCorrupt, fi.base, want, s.name, pos)
		}
		want = fi.next()
		if want <= offset {
			continue
		}
		var msgs []*ferry.EnhancedMessage
		msgs, err = decodeMessages(msgs, fi, enc, offset, q.id.Queue)
		if err != nil {
			return 0, fmt.Errorf("%w (%s at byte %d)", err, s.name, pos)
		}
		for _, m := range msgs {
			if m.Offset >= limit || len(out) == len(dst) {
				break
			}
			out = append(out, m)
		}
		if want >= limit {
			break
		}
	}
	if len(out) == 0 {
		return 0, fmt.Errorf("%w: offset %d not found in %s", ferry.ErrCorrupt, offset, s.name)
	}
	return len(out), nil
}

// sortSearchSegs returns the index of the segment holding offset, or -1.
func sortSearchSegs(segs []*segment, offset int64) int {
	i, found := slices.BinarySearchFunc(segs, offset, func(s *segment, off int64) int {
		switch {
		case off < s.base:
			return 1
		case off >= s.next:
			return -1
		}
		return 0
	})
	if !found {
		return -1
	}
	return i
}

// wakeReaders wakes every blocked reader. q.mu must be held.
func (q *queue) wakeReaders() {
	for _, ch := range q.readers {
		ch <- struct{}{} // capacity 1, and each reader is listed once
	}
	clear(q.readers)
	q.readers = q.readers[:0]
}
