package filestore

import (
	"errors"
	"os"
	"slices"
	"time"

	"github.com/ferrymq/ferry"
)

func over(v, limit int64) bool { return limit != ferry.Unlimited && v > limit }

// atLeast reports whether v reaches a bound that is not Unlimited.
func atLeast(v, limit int64) bool { return limit != ferry.Unlimited && v >= limit }

// fitting returns how many of the pending writes, in order, fit a queue
// with Block overflow, dropping released segments to make room.
func (q *queue) fitting(ret ferry.Retention) int {
	count, bytes := q.retained()
	fits := func(n int) bool {
		var c, b int64
		for _, r := range q.pending[:n] {
			c += int64(len(r.msgs))
			b += r.size
		}
		return !over(count+c, ret.MaxMessages) && !over(bytes+b, ret.MaxBytes)
	}
	n := 0
	for n < len(q.pending) && fits(n+1) {
		n++
	}
	if n > 0 || len(q.pending) == 0 {
		return n
	}
	// Make room: seal the active segment if it is all released, then drop.
	q.mu.Lock()
	released := q.released
	q.mu.Unlock()
	q.segMu.RLock()
	act := q.segs[len(q.segs)-1]
	rollable := act.count() > 0 && act.next <= released
	q.segMu.RUnlock()
	if rollable {
		if err := q.roll(); err != nil {
			q.fail(err)
			return 0
		}
	}
	if err := q.retain(time.Now()); err != nil {
		q.fail(err)
		return 0
	}
	count, bytes = q.retained()
	for n < len(q.pending) && fits(n+1) {
		n++
	}
	return n
}

// retained returns the messages and bytes the queue holds.
func (q *queue) retained() (count, bytes int64) {
	q.segMu.RLock()
	defer q.segMu.RUnlock()
	for _, s := range q.segs {
		count += s.count()
		bytes += s.sizeSum
	}
	return count, bytes
}

// rollLimits returns the bounds at which a segment stops taking messages:
// an eighth of each retention bound, so retention, which deletes whole
// segments, stays within an eighth of them.
func (q *queue) rollLimits(ret ferry.Retention) (count, bytes int64, age time.Duration) {
	count, bytes = -1, -1
	if ret.MaxMessages != ferry.Unlimited {
		count = max(1, ret.MaxMessages/8)
	}
	if ret.MaxBytes != ferry.Unlimited {
		bytes = max(1, ret.MaxBytes/8)
	}
	if ret.MaxAge > 0 {
		age = max(time.Millisecond, ret.MaxAge/8)
	}
	return count, bytes, age
}

// retains reports whether retention can ever delete a segment of a queue
// with ret and no writes waiting: one bound at least, or Block overflow.
func retains(ret ferry.Retention) bool {
	return ret.MaxAge > 0 || ret.MaxMessages != ferry.Unlimited || ret.MaxBytes != ferry.Unlimited || ret.Overflow == ferry.Block
}

// retain deletes the oldest sealed segments that retention lets go: with
// DropOldest, those whose messages all expired, and those the queue is over
// its bounds without (so a queue keeps at least its bounds, Kafka's rule);
// with Block, segments wholly released when a write waits for room, their
// messages expired, or the queue has no bound. It seals an active segment whose messages all
// expired, so that it can go too.
func (q *queue) retain(now time.Time) error {
	q.mu.Lock()
	ret, released, failed := q.ret, q.released, q.failed
	q.mu.Unlock()
	if failed != nil {
		return nil
	}
	if ret.MaxAge > 0 {
		q.segMu.RLock()
		act := q.segs[len(q.segs)-1]
		expired := act.count() > 0 && now.Sub(time.Unix(0, act.lastTime)) > ret.MaxAge &&
			(ret.Overflow != ferry.Block || act.next <= released)
		q.segMu.RUnlock()
		if expired {
			if err := q.roll(); err != nil {
				return err
			}
		}
	}
	q.segMu.Lock()
	var count, bytes int64
	for _, s := range q.segs {
		count += s.count()
		bytes += s.sizeSum
	}
	n := 0
	for n < len(q.segs)-1 {
		s := q.segs[n]
		if ret.Overflow == ferry.Block && s.next > released {
			break
		}
		old := ret.MaxAge > 0 && s.lastTime != 0 && now.Sub(time.Unix(0, s.lastTime)) > ret.MaxAge
		var drop bool
		if ret.Overflow == ferry.Block {
			// Released segments go when a write needs their room, or at
			// once in a queue with no bound, whose writes never need room
			// (it would keep every message it ever held).
			unbounded := ret.MaxMessages == ferry.Unlimited && ret.MaxBytes == ferry.Unlimited
			drop = old || len(q.pending) > 0 || unbounded
		} else {
			drop = old || atLeast(count-s.count(), ret.MaxMessages) || atLeast(bytes-s.sizeSum, ret.MaxBytes)
		}
		if !drop {
			break
		}
		count -= s.count()
		bytes -= s.sizeSum
		n++
	}
	if n == 0 {
		q.segMu.Unlock()
		return nil
	}
	drop := slices.Clone(q.segs[:n])
	q.segs = slices.Delete(q.segs, 0, n)
	oldest := q.segs[0].base
	// oldest moves with segs: a Read that misses a dropped segment then
	// sees Offsets past it.
	q.mu.Lock()
	q.oldest = oldest
	q.trimCache(oldest)
	q.mu.Unlock()
	q.segMu.Unlock()
	var errs []error
	q.syncMu.Lock() // a SyncEvery sync may still be on a dropped file
	for _, s := range drop {
		if s.f != nil {
			errs = append(errs, s.f.Close())
		}
		errs = append(errs, q.st.fds.drop(s))
	}
	q.syncMu.Unlock()
	// Oldest first and none after a failure, so that the segments left
	// are a run without a gap in the offsets. (One directory sync for
	// them all: journaling file systems commit the removals from one
	// directory in order, so a crash leaves a prefix of them done.)
	files := &q.st.files
	for _, s := range drop {
		if err := files.remove(s.name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			break
		}
		if err := files.remove(indexName(q.dir, s.base)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, files.syncDir(q.dir))
	return errors.Join(errs...)
}

// Release implements [ferry.Releaser]: with [ferry.Block] overflow,
// segments wholly below offset may be deleted to make room.
func (q *queue) Release(offset int64) {
	q.mu.Lock()
	q.released = max(q.released, offset)
	q.mu.Unlock()
	q.poke()
}

// expire runs a retention pass in the writer goroutine when the oldest
// segment has outlived the age bound, so an idle queue's Offsets and Read
// see expired messages gone.
func (q *queue) expire() {
	q.mu.Lock()
	ret, released, closed := q.ret, q.released, q.closed
	q.mu.Unlock()
	if ret.MaxAge <= 0 || closed {
		return
	}
	q.segMu.RLock()
	q.mu.Lock() // segs[0] may be the active segment
	last, held := q.segs[0].lastTime, ret.Overflow == ferry.Block && q.segs[0].next > released
	q.mu.Unlock()
	q.segMu.RUnlock()
	if last == 0 || held || time.Since(time.Unix(0, last)) <= ret.MaxAge {
		return
	}
	done := make(chan error, 1)
	select {
	case q.retainC <- done:
		<-done
	case <-q.stop:
	}
}
