package ferry

import (
	"sync"
	"time"
)

// Per-key order (OrderedByKey): a worker takes a share of a queue's
// pending messages, as in concurrent mode, and hands each to a handler
// only if no message of its key is in flight; otherwise the message waits
// behind its key. The worker that finishes a key's message goes on with
// the key's next waiting one, so each key is handled one message at a
// time, in offset order, and keys in parallel. A failure is retried in
// place (the retry loop brings it back after its backoff): its key keeps
// its waiting messages meanwhile, every other key flows on. Waiting
// messages are taken from the buffer (in flight for it), but not
// started: a revoke abandons them with the rest (see dropWaiting).

// keyed is a queue's keys in flight and the messages ready to start
// (their key claimed for them, not started yet), in offset order. Each
// key has a slot: busy while a message of the key is ready or in flight,
// with the messages of that key taken behind it, in offset order. A
// message carries its slot from the sort to its finish, so a key costs
// one map lookup per message; idle slots stay in the map (a recurring key
// finds its slot) until they outnumber the busy ones (see sweep), so the
// map holds about the keys in flight, not every key ever seen.
type keyed struct {
	mu    sync.Mutex
	slots map[string]*keySlot
	busy  int // busy slots
	ready fifo[keyedMsg]
}

// keySlot is a key's state in a queue (see keyed).
type keySlot struct {
	busy    bool
	waiting fifo[*EnhancedMessage]
}

// keyedMsg is a message with its key's slot (nil for an empty key).
type keyedMsg struct {
	msg  *EnhancedMessage
	slot *keySlot
}

// sweepMin is the idle slots a queue keeps at least before sweep drops
// them.
const sweepMin = 1024

func newKeyed() *keyed { return &keyed{slots: map[string]*keySlot{}} }

// sort files msg, just taken from the buffer: ready when its key is free
// (or empty), else waiting behind its key. Under k.mu.
func (k *keyed) sort(msg *EnhancedMessage) {
	if msg.Key == "" {
		k.ready.push(keyedMsg{msg: msg})
		return
	}
	s := k.slots[msg.Key]
	if s == nil {
		k.sweep()
		s = &keySlot{}
		k.slots[msg.Key] = s
	}
	if s.busy {
		s.waiting.push(msg)
		return
	}
	s.busy = true
	k.busy++
	k.ready.push(keyedMsg{msg, s})
}

// release ends the turn of s's message, finished: the key's next waiting
// message is ready (the key stays claimed for it), or the key is free.
// Under k.mu.
func (k *keyed) release(s *keySlot) {
	if s.waiting.len() > 0 {
		k.ready.push(keyedMsg{s.waiting.pop(), s})
		return
	}
	k.free(s)
}

// free marks s idle. Under k.mu.
func (k *keyed) free(s *keySlot) {
	if s.busy {
		s.busy = false
		k.busy--
	}
}

// sweep drops the idle slots once they outnumber the busy ones by
// sweepMin: each sweep follows at least as many new slots as it visits
// busy ones, so its cost per message is constant. Under k.mu.
func (k *keyed) sweep() {
	if len(k.slots) < 2*k.busy+sweepMin {
		return
	}
	for key, s := range k.slots {
		if !s.busy {
			delete(k.slots, key)
		}
	}
}

// hasReady reports whether messages are ready to start.
func (k *keyed) hasReady() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ready.len() > 0
}

// keyedTurns bounds the chains one worker starts before it lets the
// scheduler pick again.
const keyedTurns = 16

// runKeyed starts the messages of r whose key is free, one chain at a
// time (handleChain): a message ready to start, or, with none ready, the
// next share of the buffer's pending messages, sorted under the keys'
// lock (so in offset order, whoever takes them) into ready ones and ones
// waiting behind their key. While more are ready, r is listed again, so
// that other workers start other keys beside this one.
func (d *deliverer) runKeyed(w *worker, r *queueRun) {
	m := d.m
	dctx := w.dctx
	dctx.Context = r.hctx
	k := r.keys
	woke := false
	fin := w.finished[:0] // finished, to mark done together
	freed := w.freed[:0]  // their keys' slots, released at the next lock
	for range keyedTurns {
		k.mu.Lock()
		// The keys of what finished last turn: each key's next waiting
		// message is ready now, or the key is free.
		for _, s := range freed {
			k.release(s)
		}
		clear(freed)
		freed = freed[:0]
		if k.ready.len() == 0 && r.admits() {
			// A whole batch: what is sorted is ready for every worker
			// (not this one's, as a share in concurrent mode is).
			n, _ := r.buf.takeShare(w.batch, 1, 1)
			for _, msg := range w.batch[:n] {
				k.sort(msg)
			}
			clear(w.batch[:n])
		}
		// Cheap handlers: as many ready messages per lock as take
		// shareBudget, and no more than maxAlone: the keys of those
		// taken wait on this worker if the handler stalls on one.
		take := 1
		if d.measured.Load() {
			take = int(max(1, min(maxAlone, int64(shareBudget)/max(1, d.cost.Load()))))
		}
		todo := w.todo[:0]
		for len(todo) < take && k.ready.len() > 0 {
			todo = append(todo, k.ready.pop())
		}
		w.todo = todo
		more := k.ready.len()
		k.mu.Unlock()
		if len(todo) == 0 {
			break
		}
		// Another worker is worth waking when what is ready would take
		// this one longer than shareBudget (as in concurrent mode); what
		// is left when its turns end is listed for the next (below).
		if !woke && more > 0 && (!d.measured.Load() || int64(more)*d.cost.Load() > int64(shareBudget)) {
			m.sched.push(r)
			woke = true
		}
		stopped := false
		w.seq++
		timed := !d.measured.Load() || timeBatch(len(todo), w.seq)
		var start time.Time
		if timed {
			start = time.Now()
		}
		calls := 0
		for i, km := range todo {
			msg := km.msg
			if !r.admit() {
				for _, left := range todo[i:] {
					d.abandonSlot(r, left)
				}
				r.dropWaiting()
				stopped = true
				break
			}
			calls++
			if !d.handle(dctx, r, msg, d.firstAttempt(msg)) {
				continue // in flight (a retry scheduled, its key waiting), or given back
			}
			fin = append(fin, msg)
			if km.slot != nil {
				freed = append(freed, km.slot)
			}
		}
		if timed && calls > 0 {
			d.record(time.Since(start), calls)
		}
		fin = d.finishAll(r, fin)
		clear(todo)
		if stopped {
			break
		}
	}
	if len(freed) > 0 {
		k.mu.Lock()
		for _, s := range freed {
			k.release(s)
		}
		k.mu.Unlock()
		clear(freed)
	}
	w.freed = freed[:0]
	w.finished = d.finishAll(r, fin)
	if r.keys.hasReady() || r.buf.Pending() > 0 {
		m.sched.push(r) // what this worker left
	}
	dctx.flush(d)
}

// handleChain handles msg, then its key's waiting messages one after the
// other, until the key has none waiting (it is free again) or one stays
// in flight (a retry is scheduled: the key waits for it).
// It returns how many handler calls it made. The messages it finishes go
// to *fin, for the caller to mark done (see finishAll), or, with a nil
// fin, are marked done at once.
func (d *deliverer) handleChain(dctx *deliveryCtx, r *queueRun, msg *EnhancedMessage, fin *[]*EnhancedMessage) (calls int) {
	m := d.m
	for msg != nil {
		if !r.admit() {
			d.abandonKey(r, msg)
			return calls
		}
		calls++
		if !d.handle(dctx, r, msg, d.firstAttempt(msg)) {
			return calls // in flight (a retry scheduled, its key waiting), or given back
		}
		if fin != nil {
			*fin = append(*fin, msg)
		} else {
			r.buf.Done(msg)
			m.finished(r)
		}
		msg = d.nextOfKey(r, msg.Key)
	}
	return calls
}

// finishAll marks fin done in r's buffer (one lock, one commit) and
// returns it emptied.
func (d *deliverer) finishAll(r *queueRun, fin []*EnhancedMessage) []*EnhancedMessage {
	if len(fin) == 0 {
		return fin
	}
	r.buf.Done(fin...)
	d.m.finished(r)
	clear(fin)
	return fin[:0]
}

// nextOfKey returns the next message waiting behind key, or frees the key
// (nil) when none waits.
func (d *deliverer) nextOfKey(r *queueRun, key string) *EnhancedMessage {
	if key == "" || r.keys == nil {
		return nil
	}
	k := r.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.slots[key]
	if s == nil || !s.busy {
		return nil
	}
	if s.waiting.len() == 0 {
		k.free(s)
		return nil
	}
	return s.waiting.pop()
}

// abandonKey gives msg back unfinished, and with it, when r orders by
// key, the messages waiting behind msg's key, which is free again.
func (d *deliverer) abandonKey(r *queueRun, msg *EnhancedMessage) {
	var s *keySlot
	if r.keys != nil && msg.Key != "" {
		r.keys.mu.Lock()
		s = r.keys.slots[msg.Key]
		r.keys.mu.Unlock()
	}
	d.abandonSlot(r, keyedMsg{msg, s})
}

// abandonSlot is abandonKey for a message whose slot is known.
func (d *deliverer) abandonSlot(r *queueRun, km keyedMsg) {
	r.buf.abandon(km.msg)
	if km.slot == nil {
		return
	}
	k := r.keys
	k.mu.Lock()
	var waiting []*EnhancedMessage
	for km.slot.waiting.len() > 0 {
		waiting = append(waiting, km.slot.waiting.pop())
	}
	k.free(km.slot)
	k.mu.Unlock()
	r.buf.abandon(waiting...)
}

// dropWaiting gives back, unfinished, every message of r waiting behind
// its key or ready to start: r is being released (or lost), and none of
// them may start. The keys of the ready ones are free again.
func (r *queueRun) dropWaiting() {
	if r.keys == nil {
		return
	}
	k := r.keys
	k.mu.Lock()
	var waiting []*EnhancedMessage
	for _, s := range k.slots {
		for s.waiting.len() > 0 {
			waiting = append(waiting, s.waiting.pop())
		}
	}
	for k.ready.len() > 0 {
		km := k.ready.pop()
		waiting = append(waiting, km.msg)
		if km.slot != nil {
			k.free(km.slot)
		}
	}
	k.mu.Unlock()
	r.buf.abandon(waiting...)
}
