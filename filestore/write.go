package filestore

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// run is the writer goroutine: it commits the writes sent to it (every
// write with SyncAlways, Block overflow's otherwise), syncs on SyncEvery's
// tick and runs the retention passes of the age timer, of retention or
// release news and of readers. It holds wmu while it handles an event.
func (q *queue) run() {
	defer q.wg.Done()
	var tick <-chan time.Time
	if q.cfg.sync.mode() == syncEvery {
		t := time.NewTicker(q.cfg.sync.interval())
		defer t.Stop()
		tick = t.C
	}
	age := time.NewTimer(time.Hour)
	age.Stop()
	defer age.Stop()
	for {
		select {
		case r := <-q.reqs:
			q.wmu.Lock()
			q.pending = append(q.pending, r)
			q.drain()
			if q.cfg.sync.mode() == syncAlways {
				// Writers acknowledged by the last fdatasync are runnable
				// but may not have queued their next write yet: yield
				// while they come, and until the group is as large as the
				// recent ones, so that they join this group instead of
				// the next (a group missed by some writers would
				// otherwise split them in two cohorts that alternate,
				// each with an fdatasync of its own).
				start := time.Now()
				for i := 0; ; i++ {
					runtime.Gosched()
					if q.drain() == 0 && (len(q.pending) >= q.groupHint || i >= minGather && time.Since(start) > min(q.lastSync/4, maxLinger)) {
						break
					}
				}
			}
		case <-q.kick:
			q.wmu.Lock()
		case <-age.C:
			q.wmu.Lock()
			q.ageArmed = false
		case done := <-q.retainC:
			q.wmu.Lock()
			err := q.retain(time.Now())
			if err != nil {
				q.fail(err)
			}
			q.armAge(age)
			q.wmu.Unlock()
			done <- err
			continue
		case <-tick:
			// fdatasync outside wmu, so that writers go on meanwhile;
			// syncMu keeps retention from closing the file under it.
			q.wmu.Lock()
			dirty := q.dirty
			q.dirty = false
			act := q.segs[len(q.segs)-1]
			q.syncMu.Lock()
			q.wmu.Unlock()
			if dirty && act.f != nil { // nil: reopening it failed in an undo
				if err := q.st.files.sync(act.f); err != nil {
					q.fail(err)
				}
			}
			q.syncMu.Unlock()
			continue
		case <-q.stop:
			q.wmu.Lock()
			for q.drain() > 0 {
			}
			for _, r := range q.pending {
				if r.state.CompareAndSwap(reqPending, reqTaken) {
					r.done <- writeRes{err: &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ferry.ErrClosed}}
				}
			}
			q.pending = nil
			cut, err := q.seal(q.segs[len(q.segs)-1])
			if err != nil {
				q.fail(err)
			}
			if (q.dirty || cut) && q.cfg.sync.mode() != syncNever {
				q.syncActive()
			}
			q.wmu.Unlock()
			return
		}
		q.process()
		if err := q.retain(time.Now()); err != nil {
			q.fail(err)
		}
		q.armAge(age)
		q.wmu.Unlock()
	}
}

// drain takes the writes waiting to be queued, up to maxPending pending,
// and returns how many it took.
func (q *queue) drain() int {
	n := 0
	for len(q.pending) < maxPending {
		select {
		case r := <-q.reqs:
			q.pending = append(q.pending, r)
			n++
		default:
			return n
		}
	}
	return n
}

// minGather is how many times the writer goroutine gathering a group
// under SyncAlways yields at least before it gives up waiting for the
// group to reach groupHint; it also stops after a quarter of the last
// fdatasync's time, at most maxLinger.
const (
	minGather = 16
	maxLinger = 500 * time.Microsecond
)

// maxPending bounds the writes taken into one group.
const maxPending = 4096

// armAge sets the timer to the moment the oldest segment expires. It
// leaves the timer off when that moment has passed: the segment is then
// held by Block overflow until a Release, which wakes the writer. wmu must
// be held.
func (q *queue) armAge(t *time.Timer) {
	q.mu.Lock()
	maxAge := q.ret.MaxAge
	q.mu.Unlock()
	if maxAge <= 0 {
		return
	}
	q.segMu.RLock()
	last := q.segs[0].lastTime
	q.segMu.RUnlock()
	if last == 0 {
		return
	}
	if d := time.Until(time.Unix(0, last).Add(maxAge)); d >= 0 {
		t.Reset(d + time.Millisecond)
		q.ageArmed = true
	}
}

// process commits the pending writes that fit, in order.
func (q *queue) process() {
	q.pending = slices.DeleteFunc(q.pending, func(r *writeReq) bool {
		return r.state.Load() == reqCanceled
	})
	if len(q.pending) == 0 {
		return
	}
	q.mu.Lock()
	failed, ret := q.failed, q.ret
	q.mu.Unlock()
	if failed != nil {
		for _, r := range q.pending {
			if r.state.CompareAndSwap(reqPending, reqTaken) {
				r.done <- writeRes{err: &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: failed}}
			}
		}
		q.pending = q.pending[:0]
		return
	}
	take := len(q.pending)
	if ret.Overflow == ferry.Block {
		take = q.fitting(ret)
		// Those that cannot wait are refused now.
		rest := q.pending[take:]
		q.pending = q.pending[:take]
		for _, r := range rest {
			if r.try && r.state.CompareAndSwap(reqPending, reqTaken) {
				r.done <- writeRes{err: &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: ferry.ErrQueueFull}}
				continue
			}
			q.pending = append(q.pending, r)
		}
	}
	batch := make([]*writeReq, 0, take)
	for _, r := range q.pending[:take] {
		if r.state.CompareAndSwap(reqPending, reqTaken) {
			batch = append(batch, r)
		}
	}
	q.pending = slices.Delete(q.pending, 0, take)
	if len(batch) > 0 {
		q.commit(batch)
	}
}

// commit writes batch and acknowledges each of its writes.
func (q *queue) commit(batch []*writeReq) {
	q.groupHint = max(len(batch), q.groupHint-q.groupHint/64)
	q.flat = q.flat[:0]
	for _, r := range batch {
		q.flat = append(q.flat, r.msgs...)
	}
	q.mu.Lock()
	ret := q.ret
	q.mu.Unlock()
	next := q.next
	err := q.appendMsgs(q.flat, ret)
	clear(q.flat)
	for _, r := range batch {
		if err != nil {
			r.done <- writeRes{err: &ferry.Error{Op: fmt.Sprintf("filestore: write %s", q.id), Err: err}}
			continue
		}
		// The group's stored messages took offsets from next on, in
		// order: each write's first is where its share began.
		first := next
		for _, m := range r.msgs {
			if m.Offset == next {
				next++
			}
		}
		r.done <- writeRes{first: first}
	}
}

// appendMsgs stores msgs: offsets, one write per segment touched, one
// fdatasync with SyncAlways, then publishes them to readers and runs
// retention. On failure it undoes the writes, fails the queue and returns
// the queue's error. ret is the queue's retention as read under mu. wmu
// must be held: it is held by every writer of q.next and q.segs, so they
// are read here without mu and segMu.
//
// A queue that deduplicates stores only the messages whose keys are new
// (see dedupe); the stored ones take the offsets from q.next on in the
// order of msgs, so that a writer tells its duplicates by their offsets
// ([ferry.Duplicates]), its first offset being q.next before the call.
func (q *queue) appendMsgs(msgs []*ferry.EnhancedMessage, ret ferry.Retention) error {
	now := q.stamp()
	nowNano := now.UnixNano()
	first := q.next
	mark := -1
	if q.dd != nil {
		msgs, mark = q.dedupe(msgs, nowNano)
		if len(msgs) == 0 {
			return nil
		}
		defer func() {
			clear(q.keep)
			q.keep = q.keep[:0]
		}()
	}
	rollCount, rollBytes, rollAge := q.rollLimits(ret)

	off := first
	q.enc, q.ends = q.enc[:0], q.ends[:0]
	for _, m := range msgs {
		m.Queue = q.id.Queue
		m.Offset = off
		m.StoreUnixNano = nowNano
		off++
		q.enc = codec.Append(q.enc, m)
		q.ends = append(q.ends, len(q.enc))
	}

	var touchedBuf [2]undo
	touched := touchedBuf[:0]
	segsBefore := len(q.segs)
	fail := func(err error) error {
		if mark >= 0 {
			q.dd.Rollback(mark)
		}
		// Take the write back, then fail the queue: nothing touches a
		// mapping past a cut.
		if uerr := q.undo(touched, segsBefore); uerr != nil {
			q.st.cfg.log.Error("ferry: filestore: undo of a failed write stopped; Open takes the frames left", "queue", q.id.String(), "err", uerr)
		}
		q.fail(err)
		return q.failedErr()
	}
	encStart := func(j int) int {
		if j == 0 {
			return 0
		}
		return q.ends[j-1]
	}

	var last *segment // the segment whose frames are accounted for when published
	i := 0
	for i < len(msgs) {
		act := q.segs[len(q.segs)-1]
		cnt, size, sum, firstTime := act.count(), act.size, act.sizeSum, act.firstTime
		accepts := func(m *ferry.EnhancedMessage, encLen int) bool {
			if cnt == 0 {
				return true
			}
			return size+int64(encLen)+frameHeader <= q.cfg.segmentBytes &&
				(rollCount < 0 || cnt+1 <= rollCount) &&
				(rollBytes < 0 || sum+int64(m.Size()) <= rollBytes) &&
				(rollAge == 0 || now.Sub(time.Unix(0, firstTime)) < rollAge)
		}
		if !accepts(msgs[i], q.ends[i]-encStart(i)) {
			if err := q.roll(); err != nil {
				return fail(err)
			}
			continue
		}
		// Frames for this segment.
		at := size
		q.frames, q.spans = q.frames[:0], q.spans[:0]
		for i < len(msgs) {
			j, fsum := i, int64(0)
			for j < len(msgs) {
				m, l := msgs[j], q.ends[j]-encStart(j)
				if j > i && q.ends[j]-encStart(i)+frameHeader > q.cfg.maxFrameBytes {
					break
				}
				if !accepts(m, l) {
					break
				}
				cnt++
				size += int64(l)
				if j == i {
					size += frameHeader
				}
				sum += int64(m.Size())
				fsum += int64(m.Size())
				j++
			}
			if j == i {
				break
			}
			q.frames = append(q.frames, frameInfo{base: msgs[i].Offset, count: j - i, time: nowNano, sizeSum: fsum, totalLen: frameHeader + q.ends[j-1] - encStart(i)})
			q.spans = append(q.spans, [2]int{encStart(i), q.ends[j-1]})
			if firstTime == 0 {
				firstTime = nowNano
			}
			i = j
		}
		touched = append(touched, undo{act, act.next, act.size, act.sizeSum, act.firstTime, act.lastTime, len(act.index)})
		// The frames go straight into the mapping, or into q.out for a
		// pwrite.
		buf, mapped, err := q.activeBuf(act, at, size-at)
		if err != nil {
			return fail(err)
		}
		for k, fi := range q.frames {
			buf = appendFrame(buf, q.key.tag, fi.base, fi.count, nowNano, fi.sizeSum, q.enc[q.spans[k][0]:q.spans[k][1]])
		}
		if err := q.writeActive(act, buf, at, mapped); err != nil {
			return fail(err)
		}
		q.dirty = true
		// Account for the frames under mu, where readers look for them:
		// with the publication below unless a roll or a sync comes first.
		if i < len(msgs) || q.cfg.sync.mode() == syncAlways {
			q.mu.Lock()
			for _, fi := range q.frames {
				act.add(fi, q.cfg.indexInterval)
			}
			q.mu.Unlock()
		} else {
			last = act
		}
	}
	if q.cfg.sync.mode() == syncAlways {
		if err := q.syncActive(); err != nil {
			return fail(err)
		}
	}

	// Publish.
	q.mu.Lock()
	if last != nil {
		for _, fi := range q.frames {
			last.add(fi, q.cfg.indexInterval)
		}
	}
	q.next = off
	if q.cfg.cacheMessages > 0 {
		for _, m := range msgs {
			q.cache = append(q.cache, m)
			q.cacheBytes += int64(m.Size())
		}
		q.trimCache(q.oldest)
	} else {
		q.cacheBase = off
	}
	q.wakeReaders()
	q.mu.Unlock()
	// Retention before the acknowledgement, so a writer sees its bounds
	// kept when Write returns. A failed delete fails later writes; these
	// are on disk.
	if retains(ret) {
		if err := q.retain(now); err != nil {
			q.fail(err)
		}
	}
	if ret.MaxAge > 0 && !q.ageArmed {
		q.poke() // the writer goroutine arms the age timer
	}
	if cap(q.enc) > 16<<20 { // do not hold on to the buffers of a huge batch
		q.enc, q.out = nil, nil
	}
	return nil
}

// clockResync bounds how long stamp goes without reading the wall clock.
const clockResync = 100 * time.Millisecond

// stamp returns the current time for StoreTime. It reads the wall clock at
// most every clockResync and in between advances the last reading by the
// monotonic clock alone, which costs half as much (like the core's
// producer clock). wmu must be held.
func (q *queue) stamp() time.Time {
	if !q.clock.IsZero() {
		if d := time.Since(q.clock); d >= 0 && d < clockResync {
			return q.clock.Add(d)
		}
	}
	q.clock = time.Now()
	return q.clock
}

// trimCache keeps the cache within its bounds and at or above oldest.
// q.mu must be held.
func (q *queue) trimCache(oldest int64) {
	for q.cacheHead < len(q.cache) {
		live := len(q.cache) - q.cacheHead
		if q.cacheBase >= oldest && live <= q.cfg.cacheMessages && q.cacheBytes <= q.cfg.cacheBytes {
			break
		}
		q.cacheBytes -= int64(q.cache[q.cacheHead].Size())
		q.cache[q.cacheHead] = nil
		q.cacheHead++
		q.cacheBase++
	}
	if q.cacheHead == len(q.cache) {
		q.cache, q.cacheHead, q.cacheBase = q.cache[:0], 0, max(q.next, oldest)
	} else if q.cacheHead > len(q.cache)/2 {
		n := copy(q.cache, q.cache[q.cacheHead:])
		clear(q.cache[n:])
		q.cache, q.cacheHead = q.cache[:n], 0
	}
}

// syncActive fdatasyncs the active segment.
func (q *queue) syncActive() error {
	q.segMu.RLock()
	act := q.segs[len(q.segs)-1]
	q.segMu.RUnlock()
	q.dirty = false
	if act.f == nil { // reopening it failed in an undo: the queue failed
		return nil
	}
	start := time.Now()
	err := q.st.files.sync(act.f)
	q.lastSync = time.Since(start)
	if err != nil {
		q.fail(err)
		return err
	}
	return nil
}

// fail makes the queue fail every later write.
func (q *queue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.failed == nil {
		q.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		q.publishState()
		q.st.cfg.log.Error("ferry: filestore: queue failed", "queue", q.id.String(), "err", err)
	}
}

func (q *queue) failedErr() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}
