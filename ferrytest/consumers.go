package ferrytest

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// Backend is one deployment of a backend for one subtest of
// [TestConsumers]: where brokers keep their messages and cursors and how
// their consumers coordinate. The suite closes Storage, Cursors (once, if
// it is the same value as Storage) and Coordinator when the subtest ends,
// after every broker it made over them.
type Backend struct {
	Storage ferry.Storage
	Cursors ferry.CursorStore
	// Coordinator, nil for the broker's own [ferry.MemoryCoordinator].
	Coordinator ferry.Coordinator
	// Reopen, when set, opens the same deployment again: the suite calls it
	// after it closed every broker over this Backend and the Backend
	// itself, and expects what was stored (messages, topics, cursors) in
	// the Backend it returns, which it closes in its turn. Nil for a
	// backend that keeps nothing across a close (memory): the subtests that
	// reopen then keep the one Backend open from round to round instead.
	Reopen func(t *testing.T) Backend
	// Expire, when set, makes the session of member in group g of
	// Coordinator (which must then be set) expire as if the member had
	// gone silent for the time to live, its leases lost: as
	// [CoordinatorFeatures].Expire, a [FakeCoordinator]'s Expire, say. It
	// may return before the expiry takes effect. With it, TestConsumers
	// checks what a lease loss does to a consumer (the LeaseLoss
	// subtest); without it, that subtest is skipped.
	Expire func(g ferry.GroupKey, member string)
}

func (b Backend) close() error {
	var errs []error
	if b.Storage != nil {
		errs = append(errs, b.Storage.Close())
	}
	if b.Cursors != nil && !sameCloser(b.Cursors, b.Storage) {
		errs = append(errs, b.Cursors.Close())
	}
	if b.Coordinator != nil && !sameCloser(b.Coordinator, b.Storage) && !sameCloser(b.Coordinator, b.Cursors) {
		errs = append(errs, b.Coordinator.Close())
	}
	return errors.Join(errs...)
}

// sameCloser reports whether a and b are the one value (comparing only
// comparable dynamic types).
func sameCloser(a, b any) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a != nil && b != nil && a == b
}

// BackendOpener returns a fresh, empty Backend for one subtest. It reports
// its own failures through t.
type BackendOpener func(t *testing.T) Backend

// ConsumerFeatures says how [TestConsumers] should treat a backend.
type ConsumerFeatures struct {
	// Scale multiplies the message counts of the subtests that send many
	// (a slow backend passes 0.1, say, rather than skip them); zero means
	// 1. Counts never go below a floor that still exercises the subtest.
	Scale float64
	// Timeout bounds each subtest (see the package doc on the watchdog)
	// and every wait in it. Zero means [DefaultTimeout].
	Timeout time.Duration
	// Known maps the names of subtests that fail on the backend for a
	// known defect of it to that defect: they are skipped with it as the
	// reason, unless the environment variable FERRY_KNOWN_DEFECTS is 1,
	// which runs them, to see whether the defect is still there.
	Known map[string]string
}

func (f ConsumerFeatures) scale(n, floor int) int {
	if f.Scale > 0 {
		n = int(float64(n) * f.Scale)
	}
	return max(n, floor)
}

// TestConsumers checks that push and pull consumers keep their contract
// over a backend: brokers over the Storage, CursorStore and Coordinator
// open returns (a fresh Backend for every subtest) deliver, commit,
// resume and rebalance as over memory. The subtests:
//
//   - ExactlyOnceStableGroup: three members split eight queues as
//     [ferry.AllocateAveragely] says, never a queue held twice, and
//     handle every message once; once split, no member loses a queue
//     and no commit is refused with [ferry.ErrFenced] (a fenced store
//     refuses only the commits of a lease that was lost).
//   - LeaseLoss (with [Backend].Expire): a member's session expires while
//     it is inside a handler; the handler is cancelled at once, the old
//     member handles and commits nothing more of the queue, the new owner
//     starts at the last commit before the loss with a larger token, and
//     over a [ferry.FencedCursorStore] a late commit of the old owner is
//     refused and moves nothing.
//   - ResumeFromCommittedCursor: a closed consumer's group resumes at its
//     committed cursor (only new messages); a closed consumer does not
//     start again.
//   - StartFromOnNewGroup: a new group starts at the earliest message, or
//     with [ferry.WithStartFrom](Latest) at the end.
//   - OrderedPerKeyOrder: two [ferry.Ordered] members handle each key's
//     messages in the order sent.
//   - Broadcast: every [ferry.Broadcast] member holds every queue and
//     handles every message once.
//   - BroadcastCursorsPerMember: a broadcast member's cursor is kept
//     under group@member; the same member resumes, a new one starts over.
//   - TagsFilterAndStillCommit: [ferry.WithTags] drops other tags and
//     commits past them.
//   - PullPollCommitResume: Poll and Commit; an uncommitted message holds
//     its queue's cursor and is polled again by the next member.
//   - PullMessagesAutoCommit: Messages with [ferry.WithAutoCommit]
//     commits what it yielded; a cancelled context ends it.
//   - PullAndPushShareAGroup: a pull and a push member split a group.
//   - Churn: members join and leave between produced batches; nothing is
//     lost and, every release draining fully, nothing handled twice.
//   - ChurnModel: a model-based churn test: members of a concurrent and
//     an ordered group join, leave, crash and restart at random while
//     handlers fail, panic, dead-letter and stall; a tracker checks, as
//     events happen and at the end of every round, that no two members
//     are inside one (group, queue), ordered handling, cursors never
//     moving back, no loss and every permanent failure dead-lettered.
//     With [Backend].Reopen it closes and reopens the Backend between
//     rounds (sometimes closing the broker with members live). The
//     environment variables FERRY_CHURN_SEED, FERRY_CHURN_ROUNDS and
//     FERRY_CHURN_DLQ_FAULTS replay a seed, set the rounds and turn the
//     injected dead-letter failures off.
func TestConsumers(t *testing.T, f ConsumerFeatures, open BackendOpener) {
	t.Helper()
	s := &consumerSuite{f: f, open: open}
	ff := Features{Timeout: f.Timeout}
	known := func(t *testing.T, name string) {
		if why, ok := f.Known[name]; ok && os.Getenv("FERRY_KNOWN_DEFECTS") != "1" {
			t.Skipf("known defect of the backend (FERRY_KNOWN_DEFECTS=1 runs it): %s", why)
		}
	}
	sub := func(name string, body func(e *env)) {
		run(t, ff, name, func(t *testing.T, w *watchdog) { known(t, name); body(s.env(t, w)) })
	}
	sub("ExactlyOnceStableGroup", s.exactlyOnce)
	sub("LeaseLoss", s.leaseLoss)
	sub("ResumeFromCommittedCursor", s.resume)
	sub("StartFromOnNewGroup", s.startFrom)
	sub("OrderedPerKeyOrder", s.ordered)
	sub("Broadcast", s.broadcast)
	sub("BroadcastCursorsPerMember", s.broadcastCursors)
	sub("TagsFilterAndStillCommit", s.tags)
	sub("PullPollCommitResume", s.pullPollCommit)
	sub("PullMessagesAutoCommit", s.pullMessages)
	sub("PullAndPushShareAGroup", s.pullAndPush)
	sub("Churn", s.churn)
	run(t, ff, "ChurnModel", func(t *testing.T, w *watchdog) { known(t, "ChurnModel"); s.churnModel(t, w) })
}

type consumerSuite struct {
	f    ConsumerFeatures
	open BackendOpener
}

// env is one subtest's backend and watchdog.
type env struct {
	t  *testing.T
	w  *watchdog
	f  ConsumerFeatures
	be Backend
}

func (s *consumerSuite) env(t *testing.T, w *watchdog) *env {
	be := s.open(t)
	t.Cleanup(func() {
		if err := be.close(); err != nil {
			t.Errorf("ferrytest: close backend: %v", err)
		}
	})
	return &env{t: t, w: w, f: s.f, be: be}
}

// newTopic returns a broker over the backend holding topic "t" with n
// queues, closed when the subtest ends (before the backend).
func (e *env) newTopic(n int) *ferry.Broker {
	e.t.Helper()
	b := NewBroker(e.t, ferry.WithStorage(e.be.Storage), ferry.WithCursorStore(e.be.Cursors), ferry.WithCoordinator(e.be.Coordinator))
	must(e.t, b.CreateTopic(e.w.ctx, ferry.TopicMeta{Name: "t", Queues: n}), "create topic")
	return b
}

// Produce sends n messages to topic with bodies "<prefix><i>", keyed by
// "k<i % keys>", in batches of 500.
func Produce(t testing.TB, b *ferry.Broker, topic, prefix string, n, keys int) {
	t.Helper()
	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	const batch = 500
	for lo := 0; lo < n; lo += batch {
		msgs := make([]*ferry.Message, 0, batch)
		for i := lo; i < min(n, lo+batch); i++ {
			msgs = append(msgs, &ferry.Message{Topic: topic, Key: "k" + strconv.Itoa(i%keys), Body: []byte(prefix + strconv.Itoa(i))})
		}
		_, err := p.SendBatch(context.Background(), msgs)
		must(t, err, "send batch")
	}
}

// Tally counts handled messages by body and signals when a number of
// distinct bodies has been seen.
type Tally struct {
	mu     sync.Mutex
	seen   map[string]int
	want   int
	all    chan struct{}
	closed bool
}

// NewTally returns a Tally that is complete once want distinct bodies
// were added.
func NewTally(want int) *Tally {
	return &Tally{seen: map[string]int{}, want: want, all: make(chan struct{})}
}

// Add counts one handling of body.
func (c *Tally) Add(body string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[body]++
	if !c.closed && len(c.seen) >= c.want {
		c.closed = true
		close(c.all)
	}
}

// Handler adds every message's body.
func (c *Tally) Handler() ferry.Handler {
	return ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		c.Add(string(m.Body))
		return nil
	})
}

// Duplicates is how many handlings repeated a body.
func (c *Tally) Duplicates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := 0
	for _, n := range c.seen {
		d += n - 1
	}
	return d
}

// Distinct is how many distinct bodies were added.
func (c *Tally) Distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// Count is how many times body was added.
func (c *Tally) Count(body string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[body]
}

// Bodies returns the distinct bodies added, sorted.
func (c *Tally) Bodies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.seen))
	for b := range c.seen {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// Done is closed once every wanted body was added.
func (c *Tally) Done() <-chan struct{} { return c.all }

// WaitAll waits for every wanted body, failing t after timeout (0: a
// minute).
func (c *Tally) WaitAll(t testing.TB, timeout time.Duration) {
	t.Helper()
	if timeout <= 0 {
		timeout = time.Minute
	}
	select {
	case <-c.all:
	case <-time.After(timeout):
		t.Fatalf("watchdog: %d of %d messages handled after %v", c.Distinct(), c.want, timeout)
	}
}

// waitAll waits for every wanted body within the subtest's watchdog.
func (e *env) waitAll(c *Tally) {
	e.t.Helper()
	select {
	case <-c.all:
	case <-e.w.ctx.Done():
		e.t.Fatalf("%d of %d messages handled", c.Distinct(), c.want)
	}
}

// waitFor waits for cond within the subtest's timeout.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	WaitFor(e.t, e.f.Timeout, what, cond, nil)
}

// StartConsumer makes and starts a consumer of group on topic "t" of b,
// closed when the test ends (a Close error fails it).
func StartConsumer(t testing.TB, b *ferry.Broker, group string, h ferry.Handler, opts ...ferry.ConsumerOption) *ferry.Consumer {
	t.Helper()
	c, err := b.NewConsumer(group, "t", h, opts...)
	must(t, err, "new consumer")
	must(t, c.Start(context.Background()), "start consumer")
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close consumer %s: %v", c.MemberID(), err)
		}
	})
	return c
}

// Owners returns every member's assignment and fails t on a queue held
// twice.
func Owners(t testing.TB, cs ...*ferry.Consumer) map[ferry.QueueID]string {
	t.Helper()
	owners := map[ferry.QueueID]string{}
	for _, c := range cs {
		for _, q := range c.Assigned() {
			if o, ok := owners[q]; ok {
				t.Errorf("queue %s held by %s and %s", q, o, c.MemberID())
			}
			owners[q] = c.MemberID()
		}
	}
	return owners
}

func check(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

func (s *consumerSuite) exactlyOnce(e *env) {
	t := e.t
	n := e.f.scale(12000, 300)
	if testing.Short() {
		n = e.f.scale(3000, 300)
	}
	b := e.newTopic(8)
	c := NewTally(n)
	var cs []*ferry.Consumer
	watch := &stableWatch{t: t}
	for i := range 3 {
		id := "m" + strconv.Itoa(i)
		cs = append(cs, StartConsumer(t, b, "g", c.Handler(), append(watch.opts(id), ferry.WithMemberID(id))...))
	}
	// AllocateAveragely over m0, m1, m2: {0,1,2}, {3,4,5}, {6,7}.
	want := [][]ferry.QueueID{{{Topic: "t", Queue: 0}, {Topic: "t", Queue: 1}, {Topic: "t", Queue: 2}}, {{Topic: "t", Queue: 3}, {Topic: "t", Queue: 4}, {Topic: "t", Queue: 5}}, {{Topic: "t", Queue: 6}, {Topic: "t", Queue: 7}}}
	e.waitFor("the averaged split", func() bool {
		Owners(t, cs...) // never a queue held twice, even mid-rebalance
		for i, c := range cs {
			if !slices.Equal(want[i], c.Assigned()) {
				return false
			}
		}
		return true
	})
	watch.stable.Store(true)

	Produce(t, b, "t", "m", n, 1000)
	e.waitAll(c)
	// Every commit is in before the group stops being stable.
	e.waitFor("every message committed", func() bool {
		offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 8)
		must(t, err, "load cursors")
		sum := int64(0)
		for _, o := range offs {
			sum += max(o, 0)
		}
		return sum == int64(n)
	})
	watch.stable.Store(false)
	for _, cn := range cs {
		must(t, cn.Close(), "close")
	}
	check(t, c.Distinct() == n, "%d distinct messages handled, want %d", c.Distinct(), n)
	check(t, c.Duplicates() == 0, "a stable group handles each message once: %d duplicates", c.Duplicates())
}

func (s *consumerSuite) resume(e *env) {
	t := e.t
	b := e.newTopic(2)
	Produce(t, b, "t", "a", 100, 10)
	first := NewTally(100)
	c1 := StartConsumer(t, b, "g", first.Handler())
	e.waitAll(first)
	must(t, c1.Close(), "close")
	wantErr(t, c1.Start(context.Background()), ferry.ErrClosed, "Start after Close")
	must(t, c1.Close(), "Close again (idempotent)")

	Produce(t, b, "t", "b", 50, 10)
	second := NewTally(50)
	StartConsumer(t, b, "g", second.Handler())
	e.waitAll(second)
	for _, body := range second.Bodies() {
		check(t, body[0] == 'b', "a resumed group sees only new messages, got %q", body)
	}
}

func (s *consumerSuite) startFrom(e *env) {
	t := e.t
	b := e.newTopic(1)
	Produce(t, b, "t", "old", 10, 1)

	latest := NewTally(5)
	StartConsumer(t, b, "late", latest.Handler(), ferry.WithStartFrom(ferry.Latest))
	earliest := NewTally(15)
	StartConsumer(t, b, "early", earliest.Handler()) // Earliest is the default
	Produce(t, b, "t", "new", 5, 1)
	e.waitAll(latest)
	e.waitAll(earliest)
	for _, body := range latest.Bodies() {
		check(t, strings.Contains(body, "new"), "Latest handled %q", body)
	}
	check(t, earliest.Distinct() == 15, "Earliest handled %d, want 15", earliest.Distinct())
}

func (s *consumerSuite) ordered(e *env) {
	t := e.t
	keys, perKey := 40, e.f.scale(100, 10)
	b := e.newTopic(4)
	var mu sync.Mutex
	last := map[string]int{}
	var bad []string
	c := NewTally(keys * perKey)
	h := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		seq, _ := strconv.Atoi(string(m.Body[strings.IndexByte(string(m.Body), '/')+1:]))
		mu.Lock()
		if prev, ok := last[m.Key]; ok && seq != prev+1 {
			bad = append(bad, m.Key+": "+strconv.Itoa(prev)+" then "+strconv.Itoa(seq))
		}
		last[m.Key] = seq
		mu.Unlock()
		c.Add(string(m.Body))
		return nil
	})
	StartConsumer(t, b, "g", h, ferry.Ordered(), ferry.WithConcurrency(8), ferry.WithMemberID("a"))
	StartConsumer(t, b, "g", h, ferry.Ordered(), ferry.WithConcurrency(8), ferry.WithMemberID("b"))
	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	for i := range perKey {
		msgs := make([]*ferry.Message, keys)
		for k := range keys {
			key := "key" + strconv.Itoa(k)
			msgs[k] = &ferry.Message{Topic: "t", Key: key, Body: []byte(key + "/" + strconv.Itoa(i))}
		}
		_, err := p.SendBatch(context.Background(), msgs)
		must(t, err, "send batch")
	}
	e.waitAll(c)
	mu.Lock()
	defer mu.Unlock()
	check(t, len(bad) == 0, "out of order: %v", bad)
	for k := range keys {
		key := "key" + strconv.Itoa(k)
		check(t, last[key] == perKey-1, "%s: last handled %d, want %d", key, last[key], perKey-1)
	}
}

func (s *consumerSuite) broadcast(e *env) {
	t := e.t
	n := e.f.scale(1000, 200)
	b := e.newTopic(4)
	var tallies []*Tally
	for i := range 3 {
		c := NewTally(n)
		tallies = append(tallies, c)
		cn := StartConsumer(t, b, "fanout", c.Handler(), ferry.Broadcast(), ferry.WithMemberID("m"+strconv.Itoa(i)))
		check(t, len(cn.Assigned()) == 4, "a broadcast member holds every queue: %v", cn.Assigned())
	}
	Produce(t, b, "t", "x", n, 50)
	for _, c := range tallies {
		e.waitAll(c)
		check(t, c.Duplicates() == 0, "%d duplicates", c.Duplicates())
	}
}

func (s *consumerSuite) broadcastCursors(e *env) {
	t := e.t
	cursors := e.be.Cursors
	b := e.newTopic(1)
	Produce(t, b, "t", "x", 20, 1)
	c := NewTally(20)
	cn := StartConsumer(t, b, "fanout", c.Handler(), ferry.Broadcast(), ferry.WithMemberID("m1"))
	e.waitAll(c)
	must(t, cn.Close(), "close")
	offs, err := cursors.Load(e.w.ctx, "t", "fanout@m1", 1)
	must(t, err, "load fanout@m1")
	check(t, slices.Equal(offs, []int64{20}), "a broadcast member's cursor is kept under <group>@<member>: %v, want [20]", offs)
	offs, err = cursors.Load(e.w.ctx, "t", "fanout", 1)
	must(t, err, "load fanout")
	check(t, slices.Equal(offs, []int64{-1}), "the group's own cursor: %v, want [-1]", offs)

	// The same member ID resumes where it stopped; a new one starts over.
	Produce(t, b, "t", "y", 5, 1)
	again := NewTally(5)
	StartConsumer(t, b, "fanout", again.Handler(), ferry.Broadcast(), ferry.WithMemberID("m1"))
	fresh := NewTally(25)
	StartConsumer(t, b, "fanout", fresh.Handler(), ferry.Broadcast(), ferry.WithMemberID("m2"))
	e.waitAll(again)
	e.waitAll(fresh)
	for _, body := range again.Bodies() {
		check(t, body[0] == 'y', "m1 resumed with %q", body)
	}
}

func (s *consumerSuite) tags(e *env) {
	t := e.t
	b := e.newTopic(1)
	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	for i := range 30 {
		tag := []string{"red", "green", "blue"}[i%3]
		_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Tag: tag, Body: []byte(tag + strconv.Itoa(i))})
		must(t, err, "send")
	}
	c := NewTally(20)
	cn := StartConsumer(t, b, "g", c.Handler(), ferry.WithTags("red", "blue"))
	e.waitAll(c)
	must(t, cn.Close(), "close")
	for _, body := range c.Bodies() {
		check(t, !strings.HasPrefix(body, "green"), "filtered out, but handled: %s", body)
	}
	offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 1)
	must(t, err, "load")
	check(t, slices.Equal(offs, []int64{30}), "the filtered messages are committed too: %v, want [30]", offs)
}

func (s *consumerSuite) pullPollCommit(e *env) {
	t := e.t
	b := e.newTopic(2)
	Produce(t, b, "t", "x", 40, 8)

	pc, err := b.NewPullConsumer("g", "t")
	must(t, err, "new pull consumer")
	_, err = pc.Poll(e.w.ctx, 0)
	wantErr(t, err, ferry.ErrInvalidOption, "Poll(0)")

	seen := map[string]bool{}
	var kept []*ferry.EnhancedMessage
	for len(seen) < 40 {
		msgs, err := pc.Poll(e.w.ctx, 7)
		must(t, err, "poll")
		if len(msgs) == 0 || len(msgs) > 7 {
			t.Fatalf("Poll(7) returned %d messages", len(msgs))
		}
		for _, m := range msgs {
			if seen[string(m.Body)] {
				t.Fatalf("polled twice: %s", m.Body)
			}
			seen[string(m.Body)] = true
			if m.Queue == 0 && m.Offset == 3 {
				kept = append(kept, m) // never committed
				continue
			}
			must(t, pc.Commit(e.w.ctx, m), "commit")
		}
	}
	check(t, slices.Equal(pc.Assigned(), []ferry.QueueID{{Topic: "t", Queue: 0}, {Topic: "t", Queue: 1}}), "assigned %v", pc.Assigned())
	must(t, pc.Close(), "close")
	must(t, pc.Close(), "close again")
	_, err = pc.Poll(e.w.ctx, 1)
	wantErr(t, err, ferry.ErrClosed, "Poll after Close")
	wantErr(t, pc.Commit(e.w.ctx, kept...), ferry.ErrClosed, "Commit after Close")

	offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 2)
	must(t, err, "load")
	check(t, offs[0] == 3, "the uncommitted message holds its queue's cursor: %v", offs)

	// The next member of the group gets queue 0 again from offset 3.
	again, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	defer again.Close()
	msgs, err := again.Poll(e.w.ctx, 100)
	must(t, err, "poll")
	if len(msgs) == 0 {
		t.Fatal("Poll returned nothing")
	}
	check(t, msgs[0].Queue == 0 && msgs[0].Offset == 3, "first polled %d@%d, want 0@3", msgs[0].Queue, msgs[0].Offset)
}

func (s *consumerSuite) pullMessages(e *env) {
	t := e.t
	b := e.newTopic(1)
	Produce(t, b, "t", "x", 10, 1)
	pc, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	var got []string
	for m, err := range pc.Messages(e.w.ctx) {
		must(t, err, "messages")
		got = append(got, string(m.Body))
		if len(got) == 6 {
			break
		}
	}
	check(t, slices.Equal(got, []string{"x0", "x1", "x2", "x3", "x4", "x5"}), "got %v", got)
	must(t, pc.Close(), "close")
	offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 1)
	must(t, err, "load")
	check(t, slices.Equal(offs, []int64{6}), "cursor %v, want [6]", offs)

	// A cancelled context ends the iteration with its error.
	ctx, cancel := context.WithCancel(e.w.ctx)
	defer cancel()
	pc2, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	defer pc2.Close()
	n := 0
	for m, err := range pc2.Messages(ctx) {
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Messages ended with %v, want context.Canceled", err)
			}
			break
		}
		check(t, string(m.Body) == "x"+strconv.Itoa(6+n), "got %s, want x%d", m.Body, 6+n)
		n++
		if n == 4 {
			cancel()
		}
	}
	check(t, n == 4, "%d messages before the cancel, want 4", n)
}

func (s *consumerSuite) pullAndPush(e *env) {
	t := e.t
	n := e.f.scale(2000, 200)
	b := e.newTopic(4)
	c := NewTally(n)
	push := StartConsumer(t, b, "g", c.Handler(), ferry.WithMemberID("a-push"))
	pc, err := b.NewPullConsumer("g", "t", ferry.WithMemberID("b-pull"), ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	must(t, pc.Start(e.w.ctx), "start")
	defer pc.Close()
	e.waitFor("two queues each", func() bool { return len(push.Assigned()) == 2 && len(pc.Assigned()) == 2 })
	check(t, slices.Equal(pc.Assigned(), []ferry.QueueID{{Topic: "t", Queue: 2}, {Topic: "t", Queue: 3}}), "pull member holds %v", pc.Assigned())

	Produce(t, b, "t", "x", n, 100)
	ctx, cancel := context.WithCancel(e.w.ctx)
	defer cancel()
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		for m, err := range pc.Messages(ctx) {
			if err != nil {
				return
			}
			c.Add(string(m.Body))
		}
	}()
	e.waitAll(c)
	cancel()
	<-pulled
	check(t, c.Duplicates() == 0, "%d duplicates", c.Duplicates())
}

// churn: members join and leave the group while messages are produced:
// each churn step follows a produced batch, so membership changes every
// few milliseconds. Nothing may be lost. Duplicates can only come from
// messages in flight when a member gave a queue up without finishing them
// (the drain timeout); with handlers far faster than the drain timeout,
// every release drains fully, so there must be none.
func (s *consumerSuite) churn(e *env) {
	t := e.t
	batches, perBatch := e.f.scale(400, 30), 25
	if testing.Short() {
		batches = e.f.scale(60, 30)
	}
	n := batches * perBatch
	b := e.newTopic(8)
	c := NewTally(n)

	steps := make(chan int)
	stepped := make(chan struct{})
	churned := make(chan []*ferry.Consumer)
	go func() {
		var live []*ferry.Consumer
		seq := 0
		for step := range steps {
			if len(live) < 2 || (step%3 != 0 && len(live) < 5) {
				seq++
				cn, err := b.NewConsumer("g", "t", c.Handler(), ferry.WithMemberID("m"+strconv.Itoa(seq)), ferry.WithConcurrency(2))
				if err != nil {
					t.Errorf("new consumer: %v", err)
				} else if err := cn.Start(context.Background()); err != nil {
					t.Errorf("start: %v", err)
					_ = cn.Close()
				} else {
					live = append(live, cn)
				}
			} else {
				if err := live[0].Close(); err != nil {
					t.Errorf("close %s: %v", live[0].MemberID(), err)
				}
				live = live[1:]
			}
			stepped <- struct{}{}
		}
		churned <- live
	}()

	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	for i := range batches {
		msgs := make([]*ferry.Message, perBatch)
		for j := range msgs {
			k := i*perBatch + j
			msgs[j] = &ferry.Message{Topic: "t", Key: "k" + strconv.Itoa(k%97), Body: []byte("m" + strconv.Itoa(k))}
		}
		_, err := p.SendBatch(context.Background(), msgs)
		if err != nil {
			close(steps)
			for _, cn := range <-churned {
				_ = cn.Close()
			}
			t.Fatalf("send batch: %v", err)
		}
		steps <- i // one join or leave between every two batches
		<-stepped
		e.w.progress()
	}
	close(steps)
	live := <-churned
	defer func() {
		for _, cn := range live {
			_ = cn.Close()
		}
	}()
	if len(live) == 0 {
		t.Fatal("no member live after the churn")
	}
	e.waitAll(c)
	for _, cn := range live {
		must(t, cn.Close(), "close")
	}
	check(t, c.Distinct() == n, "nothing lost: %d of %d handled", c.Distinct(), n)
	check(t, c.Duplicates() == 0, "fully drained releases redeliver nothing: %d duplicates", c.Duplicates())
}
