package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// The tracker's dead letters, cursors and checks at the end, and the
// storage wrappers that feed it.

// deadLettered records a dead-letter write that went through.
func (tr *tracker) deadLettered(group string, queue int, off int64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	g := tr.groups[group]
	if g == nil || queue < 0 || queue >= len(g.queues) {
		tr.violateLocked(violDLQ, "dead letter for unknown group %q queue %d offset %d", group, queue, off)
		return
	}
	qt := g.queues[queue]
	r := qt.rec(off)
	r.dlq++
	r.note("dlq")
	qt.advance()
	tr.notifyLocked()
}

// failDeadLetter reports whether the dead-letter write of (group, queue,
// off) fails on purpose: the first one does.
func (tr *tracker) failDeadLetter(group string, queue int, off int64) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	k := group + "/" + strconv.Itoa(queue) + "/" + strconv.FormatInt(off, 10)
	if tr.dlqFailed[k] {
		return false
	}
	tr.dlqFailed[k] = true
	if g := tr.groups[group]; g != nil && queue >= 0 && queue < len(g.queues) {
		g.queues[queue].rec(off).note("dlq-write-failed")
	}
	return true
}

// committed records a cursor commit that the store accepted; the caller
// serializes commits per (group, queue).
func (tr *tracker) committed(group string, queue int, off int64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	g := tr.groups[group]
	if g == nil {
		return
	}
	qt := g.queues[queue]
	if off < qt.cursor && off == qt.seekTo {
		qt.seekTo = -1 // the seek's own commit
	} else if off < qt.cursor {
		tr.violateLocked(violCursor, "group %s queue %d: cursor committed at %d after %d (no reset reported)", group, queue, off, qt.cursor)
	}
	qt.cursor = off
	tr.notifyLocked()
}

// seeking allows the commit of a Seek of group's queue to to, once, to
// move the cursor back (to 0 with -1: none).
func (tr *tracker) seeking(group string, queue int, to int64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.groups[group].queues[queue].seekTo = to
}

func (tr *tracker) reset(group string, q ferry.QueueID, from, to int64) {
	tr.violate(violReset, "group %s queue %d: cursor reset from %d to %d (none expected with default retention)", group, q.Queue, from, to)
}

// settled reports whether every produced offset is finished and every
// cursor is at its queue's end, for every group; if not, what is missing
// first.
func (tr *tracker) settled() (bool, string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, name := range slices.Sorted(mapKeysOf(tr.groups)) {
		g := tr.groups[name]
		for q, qt := range g.queues {
			next := int64(len(tr.produced[q]))
			if qt.prefix < next {
				return false, fmt.Sprintf("group %s queue %d: offset %d of %d not finished", name, q, qt.prefix, next)
			}
			if qt.cursor != next {
				return false, fmt.Sprintf("group %s queue %d: cursor %d, want %d", name, q, qt.cursor, next)
			}
		}
	}
	return true, ""
}

// cursor returns the last committed cursor of (group, queue).
func (tr *tracker) cursor(group string, queue int) int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.groups[group].queues[queue].cursor
}

// dlqRead records a message read back from the dead-letter topic.
func (tr *tracker) dlqRead(m *ferry.EnhancedMessage) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	group := m.Headers[ferry.HeaderGroup]
	q, err1 := strconv.Atoi(m.Headers[ferry.HeaderOriginQueue])
	off, err2 := strconv.ParseInt(m.Headers[ferry.HeaderOriginOffset], 10, 64)
	g := tr.groups[group]
	if err1 != nil || err2 != nil || g == nil || q < 0 || q >= len(g.queues) || m.Headers[ferry.HeaderOriginTopic] != churnTopic {
		tr.violateLocked(violDLQ, "dead letter %s offset %d has bad origin headers %v", m.Topic, m.Offset, m.Headers)
		return
	}
	r := g.queues[q].rec(off)
	r.dlqRead = true
	if p := tr.producedLocked(q, off); p != "" && string(m.Body) != p {
		tr.violateLocked(violDLQ, "dead letter of group %s queue %d offset %d holds %q, produced %q", group, q, off, m.Body, p)
	}
}

func (tr *tracker) producedLocked(q int, off int64) string {
	if off < int64(len(tr.produced[q])) {
		return tr.produced[q][off]
	}
	return ""
}

// checkEnd checks, once every group is settled and the dead-letter topics
// were read back: no loss, Permanent failures dead-lettered, dead-letter
// writes readable, handled bodies as produced.
func (tr *tracker) checkEnd() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, name := range slices.Sorted(mapKeysOf(tr.groups)) {
		g := tr.groups[name]
		for q, qt := range g.queues {
			for off, r := range qt.recs {
				p := tr.producedLocked(q, int64(off))
				if int64(off) >= int64(len(tr.produced[q])) {
					tr.violateLocked(violIntegrity, "group %s queue %d: offset %d handled, only %d produced", name, q, off, len(tr.produced[q]))
					continue
				}
				if r.body != "" && r.body != p {
					tr.violateLocked(violIntegrity, "group %s queue %d offset %d: handled body %q, produced %q", name, q, off, r.body, p)
				}
				if r.ok == 0 && !r.dlqRead {
					tr.violateLocked(violLoss, "group %s queue %d offset %d (%s): neither handled successfully nor in the dead-letter topic (history: %s)",
						name, q, off, p, strings.Join(r.hist, ", "))
				}
				// A push handler fails a permanent message on every
				// delivery, but in group "conc" a pull member may get it
				// next (after a failed dead-letter write left it
				// unfinished) and finish it: a pull consumer has no
				// failure path. Then no dead letter is owed.
				if r.perm > 0 && r.ok == 0 && !r.dlqRead {
					tr.violateLocked(violPermanent, "group %s queue %d offset %d (%s): the handler returned Permanent %d times, not in the dead-letter topic (history: %s)",
						name, q, off, p, r.perm, strings.Join(r.hist, ", "))
				}
				if r.dlq > 0 && !r.dlqRead {
					tr.violateLocked(violDLQ, "group %s queue %d offset %d: dead-letter write went through, not read back", name, q, off)
				}
			}
		}
	}
}

// take returns the violations since the last take, formatted, and how
// many there were.
func (tr *tracker) take() (string, int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	n := 0
	for _, k := range violKinds {
		for _, s := range tr.viol[k] {
			fmt.Fprintf(&b, "  [%s] %s\n", k, s)
			n++
		}
	}
	clear(tr.viol)
	return b.String(), n
}

// summary returns the violation counts of the whole run.
func (tr *tracker) summary() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var parts []string
	for _, k := range violKinds {
		if n := tr.total[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

func (tr *tracker) crashed(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.crashes = append(tr.crashes, s)
}

func (tr *tracker) background(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.bgCount++
	if len(tr.bgErrs) >= 12 {
		tr.bgErrs = tr.bgErrs[1:]
	}
	tr.bgErrs = append(tr.bgErrs, s)
}

// dump describes the state of every (group, queue) for a watchdog report.
func (tr *tracker) dump() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	for _, name := range slices.Sorted(mapKeysOf(tr.groups)) {
		g := tr.groups[name]
		for q, qt := range g.queues {
			next := int64(len(tr.produced[q]))
			fmt.Fprintf(&b, "  group %s queue %d: produced %d, finished prefix %d, cursor %d, inside %v\n",
				name, q, next, qt.prefix, qt.cursor, insideList(qt))
			shown := 0
			for off := qt.prefix; off < next && shown < 4; off++ {
				r := qt.rec(off)
				if r.finished() {
					continue
				}
				shown++
				fmt.Fprintf(&b, "    unfinished offset %d (%s): ok=%d perm=%d fail=%d dlq=%d history: %s\n",
					off, tr.produced[q][off], r.ok, r.perm, r.fail, r.dlq, strings.Join(r.hist, ", "))
			}
		}
	}
	fmt.Fprintf(&b, "  crash-closes: %d, last: %v\n", len(tr.crashes), tr.crashes[max(0, len(tr.crashes)-4):])
	fmt.Fprintf(&b, "  background errors: %d, last: %s\n", tr.bgCount, strings.Join(tr.bgErrs, " | "))
	return b.String()
}

func mapKeysOf[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// newTrackedCursors returns s wrapped to tell the tracker every commit of
// the churn topic the store accepted. Commits of one (group, queue) are
// serialized across the delegate call, so the order the tracker sees is
// the store's. A commit that failed may still have been stored (a remote
// store's reply lost to a cancelled context, the request applied): the
// wrapper then reads the store, under the same lock, and tells the
// tracker the commit if the store holds it (before, the tracker missed
// such a commit of an empty queue's 0 for ever and saw a stall). A variable, so that a test of the suite can put a broken
// wrapper in its place (one that drops CommitFenced), which the
// unfenced-commit check must catch.
var newTrackedCursors = func(s ferry.CursorStore, tr *tracker) ferry.CursorStore {
	var mu sync.Mutex // guards locks
	locks := map[string]*sync.Mutex{}
	return wrapCursors(s, func(c commitCall, commit func() error) error {
		mu.Lock()
		k := c.topic + "/" + c.group + "/" + strconv.Itoa(c.queue)
		l := locks[k]
		if l == nil {
			l = &sync.Mutex{}
			locks[k] = l
		}
		mu.Unlock()
		l.Lock()
		defer l.Unlock()
		if err := commit(); err != nil {
			if c.topic == churnTopic && storedAnyway(s, c) {
				tr.committed(c.group, c.queue, c.offset)
			}
			return err
		}
		if c.topic == churnTopic {
			tr.committed(c.group, c.queue, c.offset)
		}
		return nil
	})
}

// storedAnyway reports whether the store holds the cursor of c, whose
// commit failed: it was stored though its caller was told otherwise.
func storedAnyway(s ferry.CursorStore, c commitCall) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := s.Load(ctx, c.topic, c.group, c.queue+1)
	return err == nil && offs[c.queue] == c.offset
}

// fenceProbe returns s wrapped to record, as a violation, a commit of the
// churn topic that reaches a fenced store without its token: the
// consumer commits through CommitFenced when its store has it, so a
// plain Commit here means a wrapper between the two (the tracker's own,
// say) hid CommitFenced, and the consumer's commits went unfenced.
func fenceProbe(s ferry.CursorStore, tr *tracker) ferry.CursorStore {
	_, fenced := s.(ferry.FencedCursorStore)
	return wrapCursors(s, func(c commitCall, commit func() error) error {
		if fenced && !c.fenced && c.topic == churnTopic {
			tr.violate(violUnfenced, "group %s queue %d: the consumer committed %d with a plain Commit, though the store is a FencedCursorStore: a wrapper between them dropped CommitFenced (a wrapper of a FencedCursorStore must wrap CommitFenced too)",
				c.group, c.queue, c.offset)
		}
		return commit()
	})
}

// trackedStorage is a Storage whose dead-letter queues tell the tracker
// every write that went through, and fail the first write of the
// messages whose fate says so.
type trackedStorage struct {
	ferry.Storage
	tr     *tracker
	failOf func(body []byte) bool
}

func (s *trackedStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, queue int) (ferry.Queue, error) {
	q, err := s.Storage.OpenQueue(ctx, meta, queue)
	if err != nil || !strings.HasPrefix(meta.Name, "%DLQ%") {
		return q, err
	}
	return &deadLetterQueue{Queue: q, s: s}, nil
}

type deadLetterQueue struct {
	ferry.Queue
	s *trackedStorage
}

var errInjectedDeadLetter = errors.New("churn: injected dead-letter write failure")

func (q *deadLetterQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	type origin struct {
		group string
		queue int
		off   int64
	}
	origins := make([]origin, len(msgs))
	for i, m := range msgs {
		qq, _ := strconv.Atoi(m.Headers[ferry.HeaderOriginQueue])
		off, _ := strconv.ParseInt(m.Headers[ferry.HeaderOriginOffset], 10, 64)
		origins[i] = origin{m.Headers[ferry.HeaderGroup], qq, off}
		if q.s.failOf(m.Body) && q.s.tr.failDeadLetter(origins[i].group, qq, off) {
			return 0, errInjectedDeadLetter
		}
	}
	first, err := q.Queue.Write(ctx, msgs)
	if err == nil {
		for _, o := range origins {
			q.s.tr.deadLettered(o.group, o.queue, o.off)
		}
	}
	return first, err
}

// trackLog is a slog handler that hands the consumers' background errors
// to the tracker, for the watchdog dumps.
type trackLog struct{ tr *tracker }

func (h trackLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h trackLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelError && !strings.Contains(r.Message, "drain timeout") {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "stack" {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		}
		return true
	})
	h.tr.background(b.String())
	return nil
}
func (h trackLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h trackLog) WithGroup(string) slog.Handler      { return h }

// bodyKey returns the key the churn test sent body with ("" for none).
func bodyKey(body string) string {
	if body == "" {
		return ""
	}
	return "k" + strconv.FormatUint(bodyID([]byte(body))%churnKeys, 10)
}

// grow makes room for queues queues (the topic gained some).
func (tr *tracker) grow(queues int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for len(tr.produced) < queues {
		tr.produced = append(tr.produced, nil)
	}
	for _, g := range tr.groups {
		for len(g.queues) < queues {
			g.queues = append(g.queues, &queueTrack{inside: map[*call]struct{}{}, cursor: -1, seekTo: -1})
		}
	}
}
