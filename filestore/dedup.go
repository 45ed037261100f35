package filestore

import (
	"errors"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/internal/dedup"
)

// DedupWindow implements [ferry.Deduplicator]: a write carrying a
// [ferry.Message].DedupKey stored in the queue within the topic's
// [ferry.TopicMeta].DedupWindow is not stored again. The window is kept
// in memory and rebuilt when the queue opens (after Close, a restart or
// a crash) from the messages stored within it, which the files hold with
// their keys: it survives whatever the messages survive.
func (q *queue) DedupWindow() time.Duration { return time.Duration(q.window.Load()) }

// setDedupWindow sets the window (normalized: [ferry.DedupOff] or
// positive), rebuilding it from the files when it was off.
func (q *queue) setDedupWindow(d time.Duration) error {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	return q.setDedupLocked(d)
}

// setDedupLocked is setDedupWindow. wmu must be held.
func (q *queue) setDedupLocked(d time.Duration) error {
	switch {
	case d <= 0:
		q.dd = nil
		q.window.Store(0)
		return nil
	case q.dd != nil:
		q.dd.SetDuration(d)
		q.window.Store(int64(d))
		return nil
	}
	w := dedup.New(d)
	if err := q.rebuildDedup(w, time.Now()); err != nil {
		return err
	}
	q.dd = w
	q.window.Store(int64(d))
	return nil
}

// rebuildDedup adds to w the keys of the messages stored within its
// window before now: it decodes the segments whose last frame is that
// recent, from the first of them on. wmu must be held.
func (q *queue) rebuildDedup(w *dedup.Window, now time.Time) error {
	cutoff := now.UnixNano() - int64(w.Duration())
	q.segMu.RLock()
	from := int64(-1)
	for i := len(q.segs) - 1; i >= 0; i-- {
		s := q.segs[i]
		if s.count() > 0 && s.lastTime < cutoff {
			break
		}
		if s.count() > 0 {
			from = s.base
		}
	}
	q.segMu.RUnlock()
	limit := q.next // wmu held: no writer moves it
	if from < 0 || from >= limit {
		return nil
	}
	buf := make([]*ferry.EnhancedMessage, 512)
	for off := from; off < limit; {
		n, err := q.readDisk(off, limit, buf)
		if errors.Is(err, ferry.ErrCorrupt) {
			// Damage is reported where it is read, as Open does not read
			// every frame (see WithVerify): the keys past it in its
			// segment are lost to the window, which goes on with the
			// next segment.
			q.st.cfg.log.Warn("ferry: filestore: deduplication window rebuilt without a damaged segment", "queue", q.id.String(), "offset", off, "err", err)
			if off = q.segmentAfter(off); off < 0 {
				break
			}
			continue
		}
		if err != nil {
			return err
		}
		for _, m := range buf[:n] {
			if m.DedupKey != "" && m.StoreUnixNano > cutoff {
				w.Add(dedup.HashKey(m.DedupKey), dedup.Entry{Offset: m.Offset, ID: m.ID, Stored: m.StoreUnixNano})
			}
		}
		clear(buf[:n])
		off += int64(n)
	}
	w.Expire(now.UnixNano())
	return nil
}

// dedupe returns the messages of msgs a write at store time now stores
// from offset q.next on, having added their keys to the window (from the
// mark it returns on, for a rollback if the write fails) and set every
// duplicate's Queue, Offset, ID and StoreUnixNano to those of the first
// message with its key (in the window, or earlier in msgs). wmu must be
// held, and q.dd not nil.
func (q *queue) dedupe(msgs []*ferry.EnhancedMessage, now int64) ([]*ferry.EnhancedMessage, int) {
	q.dd.Expire(now)
	mark := q.dd.Mark()
	next := q.next
	keep, copied := msgs, false // keep aliases msgs until the first duplicate
	dedup.HashAll(&q.keys, q.dd, msgs, func(m *ferry.EnhancedMessage) string { return m.DedupKey })
	for i, m := range msgs {
		if m.DedupKey != "" {
			if e, dup := q.dd.Put(q.keys.Next(m.DedupKey), dedup.Entry{Offset: next, ID: m.ID, Stored: now}, now); dup {
				if !copied {
					keep, copied = append(q.keep[:0], msgs[:i]...), true
				}
				m.Queue, m.Offset, m.ID, m.StoreUnixNano = q.id.Queue, e.Offset, e.ID, e.Stored
				continue
			}
		}
		next++
		if copied {
			keep = append(keep, m)
		}
	}
	if copied {
		q.keep = keep
	}
	return keep, mark
}

// segmentAfter returns the base of the segment after the one holding
// offset, -1 if there is none.
func (q *queue) segmentAfter(offset int64) int64 {
	q.segMu.RLock()
	defer q.segMu.RUnlock()
	i := sortSearchSegs(q.segs, offset)
	if i < 0 || i+1 >= len(q.segs) {
		return -1
	}
	return q.segs[i+1].base
}
