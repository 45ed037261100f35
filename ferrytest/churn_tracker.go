package ferrytest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ferrymq/ferry"
)

// The tracker of the ChurnModel subtest of TestConsumers: a model of what every group must have
// done with every produced offset, fed by a wrapped Handler (and the pull
// loops), a wrapped CursorStore and a wrapped Storage (dead-letter
// writes). It checks the invariants that must hold at every instant as
// events arrive (one member per (group, queue) at a time, ordered
// handling, cursors never moving back, no handler call after its queue
// was given up) and records every breach as a violation; the test checks
// the end-of-round invariants (no loss, permanent failures dead-lettered,
// cursors at the end) against it and reports the violations per round.

// Violation kinds, in the order the report lists them.
const (
	violOverlap   = "overlap"          // two members inside one (group, queue)
	violStale     = "stale-call"       // a handler called with its context already cancelled
	violOrder     = "order"            // ordered group: an offset entered before a lower one finished
	violCursor    = "cursor-backwards" // a committed cursor moved back
	violCursorEnd = "cursor-end"       // a cursor not at the queue's end once everything is handled
	violStall     = "stall"            // the round did not settle: something never finished
	violLoss      = "loss"             // a produced offset neither handled nor dead-lettered
	violPermanent = "permanent-not-dead-lettered"
	violIntegrity = "integrity" // a handled body that is not what was produced at that offset
	violReset     = "reset"     // a cursor reset (none expected with default retention)
	violSelfClose = "self-closed"
	violStart     = "start"
	violProduce   = "produce"
	violReopen    = "reopen"
	violDLQ       = "dead-letter-readback"
	violUnfenced  = "unfenced-commit" // a consumer's commit reached a fenced store without its token
)

var violKinds = []string{violOverlap, violStale, violOrder, violCursor, violStall, violCursorEnd, violLoss, violPermanent,
	violIntegrity, violReset, violSelfClose, violStart, violProduce, violReopen, violDLQ, violUnfenced}

// outcome is how one handler call (or pull handling) ended.
type outcome int

const (
	outOK outcome = iota
	outPermanent
	outFail  // an error with attempts left
	outPanic // the handler panicked
)

func (o outcome) String() string {
	return [...]string{"ok", "permanent", "error", "panic"}[o]
}

// offRec is what a group did with one offset of one queue.
type offRec struct {
	ok, perm, fail int // handler calls that returned nil, Permanent, another error or panicked
	dlq            int // dead-letter writes that went through
	dlqRead        bool
	body           string
	hist           []string
}

// finished reports whether the group is done with the offset: handled, or
// dead-lettered.
func (r *offRec) finished() bool { return r.ok > 0 || r.dlq > 0 }

func (r *offRec) note(s string) {
	if len(r.hist) < 12 {
		r.hist = append(r.hist, s)
	} else if len(r.hist) == 12 {
		r.hist = append(r.hist, "...")
	}
}

// call is a handler call in progress.
type call struct {
	group, member string
	queue         int
	offset        int64
	attempt       int
	retry         bool            // a delivery from the retry topic
	done          <-chan struct{} // the handler context's Done; nil for a pull member
	abandoned     bool            // the test crash-closed a pull member while it held the message, or expired its member's session
}

// givenUp reports whether the consumer gave up on the call: its context
// was cancelled after it started (a drain timeout), or the test
// crash-closed the pull member holding it.
// ctxDone reports whether the call's context is cancelled (a push call).
func (c *call) ctxDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *call) givenUp() bool {
	if c.abandoned {
		return true
	}
	if c.done == nil {
		return false
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *call) String() string {
	s := fmt.Sprintf("%s@%d#%d", c.member, c.offset, c.attempt)
	if c.givenUp() {
		s += "(given up)"
	}
	return s
}

type queueTrack struct {
	recs   []*offRec
	prefix int64 // smallest unfinished offset
	inside map[*call]struct{}
	cursor int64 // last committed, -1 for none
	seekTo int64 // a seek's commit allowed to move the cursor back; -1 for none
}

func (q *queueTrack) rec(off int64) *offRec {
	for int64(len(q.recs)) <= off {
		q.recs = append(q.recs, &offRec{})
	}
	return q.recs[off]
}

func (q *queueTrack) advance() {
	for q.prefix < int64(len(q.recs)) && q.recs[q.prefix].finished() {
		q.prefix++
	}
}

type groupTrack struct {
	name    string
	ordered bool
	keyed   bool // ordered per key (churnKeyed)
	queues  []*queueTrack
}

type tracker struct {
	mu       sync.Mutex
	changed  chan struct{} // closed on the next change; nil if nobody waits
	produced [][]string    // per queue, per offset: the body sent
	groups   map[string]*groupTrack
	// violations since the last take, and counts over the whole run.
	viol      map[string][]string
	total     map[string]int
	dlqFailed map[string]bool // (group, queue, offset) whose dead-letter write was failed on purpose
	crashes   []string
	bgErrs    []string
	bgCount   int
	workers   map[string]int  // push member -> its worker count
	crashing  map[string]bool // "group/member" of pull members being crash-closed
	stale     map[string]int  // "member/queue" -> stale calls seen
	// expiredGrace: "group/member" -> calls still to excuse after the test
	// expired its session (see expireMember).
	expiredGrace map[string]int
}

// setWorkers records how many workers a push member runs.
func (tr *tracker) setWorkers(member string, n int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.workers[member] = n
}

func newTracker(queues int, groups map[string]bool) *tracker {
	tr := &tracker{
		produced:  make([][]string, queues),
		groups:    map[string]*groupTrack{},
		viol:      map[string][]string{},
		total:     map[string]int{},
		dlqFailed: map[string]bool{},
		workers:   map[string]int{},
		crashing:  map[string]bool{},
		stale:     map[string]int{},

		expiredGrace: map[string]int{},
	}
	for name, ordered := range groups {
		g := &groupTrack{name: name, ordered: ordered, keyed: name == churnKeyed}
		for range queues {
			g.queues = append(g.queues, &queueTrack{inside: map[*call]struct{}{}, cursor: -1, seekTo: -1})
		}
		tr.groups[name] = g
	}
	return tr
}

// violateLocked records a breach of an invariant. tr.mu held.
func (tr *tracker) violateLocked(kind, format string, args ...any) {
	tr.total[kind]++
	if len(tr.viol[kind]) < 8 {
		tr.viol[kind] = append(tr.viol[kind], fmt.Sprintf(format, args...))
	}
}

func (tr *tracker) violate(kind, format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.violateLocked(kind, format, args...)
}

// notifyLocked wakes the waiters of wait. tr.mu held.
func (tr *tracker) notifyLocked() {
	if tr.changed != nil {
		close(tr.changed)
		tr.changed = nil
	}
}

// changes returns a channel closed at the next change.
func (tr *tracker) changes() <-chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.changed == nil {
		tr.changed = make(chan struct{})
	}
	return tr.changed
}

// produce records what SendBatch wrote.
func (tr *tracker) produce(bodies []string, res []ferry.SendResult) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, r := range res {
		q := r.Queue.Queue
		if want := int64(len(tr.produced[q])); r.Offset != want {
			tr.violateLocked(violProduce, "queue %d: %s written at offset %d, want the next offset %d", q, bodies[i], r.Offset, want)
			for int64(len(tr.produced[q])) < r.Offset {
				tr.produced[q] = append(tr.produced[q], "")
			}
		}
		if r.Offset == int64(len(tr.produced[q])) {
			tr.produced[q] = append(tr.produced[q], bodies[i])
		}
	}
	tr.notifyLocked()
}

// next returns how many offsets of queue q were produced.
func (tr *tracker) next(q int) int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return int64(len(tr.produced[q]))
}

// enter records that member starts handling (queue, off) for group and
// checks the instant invariants. done is the handler context's Done (nil
// for a pull member).
// retry marks a delivery from the group's retry topic: its queue of that
// topic has an owner of its own, so it overlaps only with other retries.
func (tr *tracker) enter(group, member string, queue int, off int64, body string, attempt int, retry bool, done <-chan struct{}) *call {
	c := &call{group: group, member: member, queue: queue, offset: off, attempt: attempt, retry: retry, done: done}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	c.abandoned = tr.crashing[group+"/"+member]
	if k := group + "/" + member; tr.expiredGrace[k] > 0 {
		tr.expiredGrace[k]--
		c.abandoned = true
	}
	g := tr.groups[group]
	qt := g.queues[queue]
	r := qt.rec(off)
	switch {
	case r.body == "":
		r.body = body
	case r.body != body:
		tr.violateLocked(violIntegrity, "group %s queue %d offset %d: member %s got body %q, earlier %q", group, queue, off, member, body, r.body)
	}
	stale := ""
	if c.done != nil && c.ctxDone() { // a push call whose context was cancelled before it started
		stale = " (the entering call is stale, see stale-call)"
		k := member + "/" + strconv.Itoa(queue)
		tr.stale[k]++
	}
	if stale != "" && tr.stale[member+"/"+strconv.Itoa(queue)] > max(1, tr.workers[member]) {
		tr.violateLocked(violStale, "group %s queue %d offset %d attempt %d: member %s called the handler with its context already cancelled (the queue was given up after a drain timeout; no call may start then)",
			group, queue, off, attempt, member)
	}
	for o := range qt.inside {
		// A stale entering call (see stale-call) is the old owner's, its
		// queue given up after a drain timeout: not an overlap either.
		if o.retry == retry && o.member != member && !o.givenUp() && stale == "" {
			tr.violateLocked(violOverlap, "group %s queue %d: member %s entered offset %d (attempt %d)%s while member %s is inside offset %d (attempt %d), which no drain timeout gave up; inside now: %v",
				group, queue, member, off, attempt, stale, o.member, o.offset, o.attempt, insideList(qt))
		}
	}
	if g.keyed {
		key := bodyKey(body)
		for lo := off - 1; lo >= qt.prefix; lo-- {
			if bodyKey(tr.producedLocked(queue, lo)) == key && !qt.rec(lo).finished() {
				tr.violateLocked(violOrder, "group %s queue %d: member %s entered offset %d (attempt %d) of key %s before its offset %d finished (history of %d: %s); inside now: %v",
					group, queue, member, off, attempt, key, lo, lo, strings.Join(qt.rec(lo).hist, ", "), insideList(qt))
				break
			}
		}
	}
	if g.ordered && off > qt.prefix {
		lo := qt.rec(qt.prefix)
		tr.violateLocked(violOrder, "group %s queue %d: member %s entered offset %d (attempt %d) before offset %d finished (history of %d: %s); inside now: %v",
			group, queue, member, off, attempt, qt.prefix, qt.prefix, strings.Join(lo.hist, ", "), insideList(qt))
	}
	r.note(fmt.Sprintf("%s#%d>", member, attempt))
	qt.inside[c] = struct{}{}
	return c
}

func insideList(qt *queueTrack) []string {
	var out []string
	for c := range qt.inside {
		out = append(out, c.String())
	}
	sort.Strings(out)
	return out
}

// handingBack records that a pull member is done handling c and is
// committing it: the commit may hand the queue over before it returns,
// so c no longer counts as inside for the overlap check.
func (tr *tracker) handingBack(c *call) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	delete(tr.groups[c.group].queues[c.queue].inside, c)
}

// exit records how a call ended.
func (tr *tracker) exit(c *call, out outcome) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	qt := tr.groups[c.group].queues[c.queue]
	delete(qt.inside, c)
	r := qt.rec(c.offset)
	switch out {
	case outOK:
		r.ok++
	case outPermanent:
		r.perm++
	default:
		r.fail++
	}
	tag := out.String()
	if c.givenUp() {
		tag += "(given up)"
	}
	r.note(fmt.Sprintf("%s#%d:%s", c.member, c.attempt, tag))
	qt.advance()
	tr.notifyLocked()
}

// abandonMember marks the calls member is inside as given up: the test
// is closing the pull member without letting it commit them.
func (tr *tracker) abandonMember(group, member string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	// Its loop runs on until Close stops it, and may poll more meanwhile:
	// those calls are abandoned too.
	tr.crashing[group+"/"+member] = true
	for _, qt := range tr.groups[group].queues {
		for c := range qt.inside {
			if c.member == member {
				c.abandoned = true
			}
		}
	}
}

// expireMember marks the calls member is inside now as given up: the
// test expired its session, as if it had been silent for its time to
// live, though its handlers were running; a member that was silent would
// have given them up by its own clock before the coordinator moved its
// queues (see ferry.DeadlineLease). The calls it starts afterwards are
// its own: an overlap of one of them is a defect.
func (tr *tracker) expireMember(group, member string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	// A worker may have passed the gate a moment before the expiry and
	// enter just after this: up to one call per worker entering from now
	// on is the expiry's too (as stale-call allows one per worker).
	tr.expiredGrace[group+"/"+member] = max(1, tr.workers[member])
	for _, qt := range tr.groups[group].queues {
		for c := range qt.inside {
			if c.member == member {
				c.abandoned = true
			}
		}
	}
}

// busy returns how many calls member is inside.
func (tr *tracker) busy(group, member string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, qt := range tr.groups[group].queues {
		for c := range qt.inside {
			if c.member == member {
				n++
			}
		}
	}
	return n
}
